//! A workload's first Pods are swapped on their first admission, because the fill controller
//! filled the mirror from the workload's template before any Pod existed: a Deployment created
//! with `replicas: 0` and scaled to 3 once its image is in the mirror, and a CronJob's first
//! run. The real chain of `rig::ahead` (kube-apiserver and kube-controller-manager,
//! policy-server 1.35 with the built module, `fill-mirror watch`); `make bench` prints its times.
//! Each test says what it guards when the fill controller does not follow templates: the mirror
//! never gets the image before a Pod asks, and the first Pods keep their source images.

mod rig;

use rig::ahead::{Ahead, FirstPods, described};
use rig::tools::RealTools;

fn chain(test: &str) -> Option<Ahead> {
    let tools = RealTools::find(test)?;
    Some(Ahead::start(
        &tools,
        &tools.annotated_policy(),
        rig::fill_mirror(),
    ))
}

fn explain(ahead: &Ahead, first: &FirstPods) -> String {
    format!(
        "{first:?}\n{:#}\nfill-mirror:\n{}",
        described(&ahead.plane),
        first.log
    )
}

#[test]
fn a_deployment_scaled_from_zero_is_swapped_on_its_first_pods() {
    let Some(ahead) = chain("ahead_of_pods a_deployment_scaled_from_zero") else {
        return;
    };

    let first = ahead.deployment_scaled_from_zero("web", 3, 30);

    assert!(
        first.template_to_mirror.is_some(),
        "the image never reached the mirror before the scale: {}",
        explain(&ahead, &first)
    );
    assert_eq!(first.images.len(), 3, "{}", explain(&ahead, &first));
    assert_eq!(first.swapped(), 3, "{}", explain(&ahead, &first));
}

#[test]
fn a_cronjob_s_first_job_pod_is_swapped() {
    let Some(ahead) = chain("ahead_of_pods a_cronjob_s_first_job_pod") else {
        return;
    };

    let first = ahead.cronjob_first_run("nightly");

    assert!(
        first.template_to_mirror.is_some(),
        "the image never reached the mirror: {}",
        explain(&ahead, &first)
    );
    assert_eq!(first.images.len(), 1, "{}", explain(&ahead, &first));
    assert_eq!(first.swapped(), 1, "{}", explain(&ahead, &first));
}
