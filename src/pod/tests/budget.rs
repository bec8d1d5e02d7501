//! The lookup budget across an admission: the first image of each registry first, every lookup
//! within the budget, and the one warning that says what was spent.

use super::*;

/// Every lookup takes `ms` on the fake clock.
struct Distant {
    inner: FakeRegistry,
    clock: FakeClock,
    ms: u64,
}

impl Registry for Distant {
    crate::registry::never_verifies!();

    fn manifest_digest(&mut self, image: &str) -> Result<String, LookupError> {
        self.clock.advance(Duration::from_millis(self.ms));
        self.inner.manifest_digest(image)
    }

    fn manifest(&mut self, image: &str) -> Result<Manifest, LookupError> {
        self.clock.advance(Duration::from_millis(self.ms));
        self.inner.manifest(image)
    }
}

fn many_images(n: usize) -> (Value, FakeRegistry) {
    let mut registry = FakeRegistry::default();
    let containers: Vec<Value> = (0..n)
        .map(|i| {
            registry.answers.insert(
                format!("mirror.example.com/dockerhub/library/app{i}:1"),
                Ok(DIGEST_A.to_string()),
            );
            json!({"name": format!("c{i}"), "image": format!("app{i}:1")})
        })
        .collect();
    (pod(json!({ "containers": containers })), registry)
}

fn budget_admission(extra: &str, n: usize, ms: u64) -> (Outcome, usize) {
    let settings = format!(
        r#"{{"mirrors":[{{"source":"docker.io","target":"mirror.example.com/dockerhub"}}]{extra}}}"#
    );
    let (object, inner) = many_images(n);
    let clock = FakeClock::default();
    let mut registry = Distant {
        inner,
        clock: clock.clone(),
        ms,
    };
    let outcome = super::super::admit(
        request("CREATE", "", object, Value::Null),
        &policy_from(&settings),
        &mut registry,
        &mut crate::verifiers::NoCluster,
        &clock,
    );
    (outcome, registry.inner.asked.len())
}

#[test]
fn the_first_images_are_swapped_and_the_rest_kept_with_one_budget_warning() {
    // 300 ms per lookup, 800 ms budget: two lookups, 28 images not looked up.
    let (outcome, asked) = budget_admission("", 30, 300);
    assert_eq!(asked, 2);
    let audit = outcome.audit.clone();
    let pod = match outcome.verdict {
        Verdict::Mutate(pod) => pod,
        other => panic!("{other:?}"),
    };
    let images: Vec<&str> = pod["spec"]["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .filter_map(|c| c["image"].as_str())
        .collect();
    assert!(
        images[..2].iter().all(|i| i.ends_with(DIGEST_A)),
        "{images:?}"
    );
    assert_eq!(
        images[2..].iter().filter(|i| i.starts_with("app")).count(),
        28
    );
    assert_eq!(
        outcome.warnings,
        [
            "lookup budget of 800 ms: 28 images were not looked up or compared in time and kept as they were (onLookupError is keep): \"app2:1\", \"app3:1\", \"app4:1\", \"app5:1\", \"app6:1\" (mirror.example.com would need about 300 ms, 200 ms were left), and 23 more; the evaluation had run 600 ms, 600 ms of it in 2 lookups (the slowest 300 ms)"
        ]
    );
    let summary: Value = serde_json::from_str(&audit["summary"]).expect("JSON");
    assert_eq!(
        summary,
        json!({"swapped": 2, "reapplied": 0, "kept": 28, "rejected": 0, "lookups": 2,
                   "lookupMilliseconds": 600, "evaluationMilliseconds": 600,
                   "budgetMilliseconds": 800, "notLookedUp": 28})
    );
    let kept: Value = serde_json::from_str(&audit["kept"]).expect("JSON");
    assert_eq!(kept[0], json!({"image": "app2:1", "reason": "budget"}));
    assert_eq!(kept.as_array().map(Vec::len), Some(AUDITED_MAX));
}

#[test]
fn with_on_lookup_error_reject_the_spent_budget_refuses_the_pod() {
    let (outcome, _) = budget_admission(r#","onLookupError":"reject""#, 30, 300);
    let message = rejection(outcome);
    assert!(
            message.starts_with("lookup budget of 800 ms: 28 images were not looked up or compared in time and refused (onLookupError is reject): \"app2:1\"")
                && message.ends_with("; the evaluation had run 600 ms, 600 ms of it in 2 lookups (the slowest 300 ms)"),
            "{message}"
        );
}

#[test]
fn a_first_lookup_longer_than_the_budget_swaps_that_image_only() {
    let (outcome, asked) = budget_admission("", 5, 1_500);
    assert_eq!(asked, 1);
    assert!(
        outcome.warnings[0]
            == "lookup budget of 800 ms: 4 images were not looked up or compared in time and kept as they were (onLookupError is keep): \"app1:1\", \"app2:1\", \"app3:1\", \"app4:1\" (the budget had run out before a lookup on mirror.example.com); the evaluation had run 1500 ms, 1500 ms of it in 1 lookup (the slowest 1500 ms)",
        "{:?}",
        outcome.warnings
    );
    let pod = mutated(outcome);
    assert!(
        pod["spec"]["containers"][0]["image"]
            .as_str()
            .is_some_and(|i| i.ends_with(DIGEST_A))
    );
}

/// Reading the request took 150 ms before the first lookup: the warning says what each
/// figure measures, the evaluation's time and the lookups' part of it.
#[test]
fn the_budget_warning_names_what_each_figure_measures() {
    let settings =
        r#"{"mirrors":[{"source":"docker.io","target":"mirror.example.com/dockerhub"}]}"#;
    let (object, inner) = many_images(5);
    let clock = FakeClock::default();
    clock.advance(Duration::from_millis(150));
    let mut registry = Distant {
        inner,
        clock: clock.clone(),
        ms: 300,
    };
    let outcome = super::super::admit(
        request("CREATE", "", object, Value::Null),
        &policy_from(settings),
        &mut registry,
        &mut crate::verifiers::NoCluster,
        &clock,
    );
    assert!(
            outcome.warnings[0].starts_with("lookup budget of 800 ms: 3 images were")
                && outcome.warnings[0].ends_with("(mirror.example.com would need about 300 ms, 50 ms were left); the evaluation had run 750 ms, 600 ms of it in 2 lookups (the slowest 300 ms)"),
            "{:?}",
            outcome.warnings
        );
    let summary: Value = serde_json::from_str(&outcome.audit["summary"]).expect("JSON");
    assert_eq!(
        (
            &summary["lookupMilliseconds"],
            &summary["evaluationMilliseconds"]
        ),
        (&json!(600), &json!(750))
    );
}

/// Lookups on two mirrors whose lookups take 85 and 405 ms (20 and 100 ms away): one image
/// on the far mirror among eight on the near one, at every position. Every lookup after the
/// first ends within the budget, and the far image is looked up while the budget is fresh.
#[test]
fn every_lookup_ends_within_the_budget_whatever_order_the_pod_names_its_registries() {
    let settings = r#"{"mirrors":[
            {"source":"docker.io","target":"near.example.com/hub"},
            {"source":"quay.io","target":"far.example.com/quay"}]}"#;
    let policy = policy_from(settings);
    for far_at in 0..=8 {
        let mut images: Vec<String> = (0..8).map(|i| format!("app{i}:1")).collect();
        images.insert(far_at, "quay.io/org/far:1".to_string());
        let containers: Vec<Value> = images
            .iter()
            .enumerate()
            .map(|(i, image)| json!({"name": format!("c{i}"), "image": image}))
            .collect();
        let clock = FakeClock::default();
        let mut registry = PerHost {
            clock: clock.clone(),
            latency_ms: [("near.example.com", 85), ("far.example.com", 405)],
            ended: Vec::new(),
        };
        let outcome = super::super::admit(
            request(
                "CREATE",
                "",
                pod(json!({ "containers": containers })),
                Value::Null,
            ),
            &policy,
            &mut registry,
            &mut crate::verifiers::NoCluster,
            &clock,
        );
        let late: Vec<_> = registry
            .ended
            .iter()
            .skip(1)
            .filter(|(_, at)| *at > 800)
            .collect();
        assert!(
            late.is_empty(),
            "far image at {far_at}: {late:?} of {:?}",
            registry.ended
        );
        let pod = mutated(outcome);
        assert!(
            pod["spec"]["containers"][far_at]["image"]
                .as_str()
                .is_some_and(|i| i.starts_with("far.example.com/quay/org/far:1@")),
            "far image at {far_at}: {pod}"
        );
    }
}

/// Answers every digest lookup after its registry host's latency, and notes when it ended.
struct PerHost {
    clock: FakeClock,
    latency_ms: [(&'static str, u64); 2],
    ended: Vec<(String, u64)>,
}

impl Registry for PerHost {
    crate::registry::never_verifies!();

    fn manifest_digest(&mut self, image: &str) -> Result<String, LookupError> {
        let host = crate::registry::registry_host(image);
        let ms = self
            .latency_ms
            .iter()
            .find(|(h, _)| *h == host)
            .map_or(0, |(_, ms)| *ms);
        self.clock.advance(Duration::from_millis(ms));
        let at = u64::try_from(self.clock.now().as_millis()).unwrap_or(u64::MAX);
        self.ended.push((image.to_string(), at));
        Ok(DIGEST_A.to_string())
    }

    fn manifest(&mut self, _image: &str) -> Result<Manifest, LookupError> {
        Err(LookupError::Failed("not used".to_string()))
    }
}

#[test]
fn near_lookups_swap_the_whole_pod() {
    let (outcome, asked) = budget_admission("", 30, 1);
    assert_eq!(asked, 30);
    assert!(outcome.warnings.is_empty(), "{:?}", outcome.warnings);
}
