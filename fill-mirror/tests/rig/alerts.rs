//! The alerts of `deploy/base/prometheus-rule.yaml` on what a running `fill-mirror` serves: its
//! `/metrics` text, as Prometheus would store it after scraping it for a while (under the
//! ServiceMonitor's `job="fill-mirror"`), evaluated by `promtool test rules` (Debian's
//! prometheus package), so that a metric renamed in the binary fails the alert's test.

use std::collections::BTreeSet;
use std::process::Command;

use serde_json::{Value, json};

/// The PrometheusRule's alerting rules as `promtool` reads a rule file (`groups:`).
pub fn rule_groups() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/base/prometheus-rule.yaml"
    );
    let text = std::fs::read_to_string(path).expect("deploy/base/prometheus-rule.yaml");
    let rule: Value = serde_yaml::from_str(&text).expect("the PrometheusRule as YAML");
    rule["spec"].clone()
}

fn alerts(groups: &Value) -> Vec<Value> {
    groups["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .filter(|r| r.get("alert").is_some())
        .collect()
}

/// Every `fill_mirror_…` name the alerts' expressions read.
pub fn names_the_alerts_read() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for alert in alerts(&rule_groups()) {
        let expr = alert["expr"].as_str().unwrap_or_default();
        let mut rest = expr;
        while let Some(at) = rest.find("fill_mirror_") {
            let tail = &rest[at..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            names.insert(tail[..end].to_string());
            rest = &tail[end..];
        }
    }
    names
}

/// The sample names of an exposition text (`name{labels} value` lines).
pub fn sample_names(exposition: &str) -> BTreeSet<String> {
    samples(exposition)
        .map(|(series, _)| {
            series
                .split(['{', ' '])
                .next()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

fn samples(exposition: &str) -> impl Iterator<Item = (String, String)> + '_ {
    exposition
        .lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            Some((series.to_string(), value.to_string()))
        })
}

/// The series a scrape of `exposition` gives, with the target's labels added, as promtool's
/// input series held for `minutes`; and the target's `up`.
fn input_series(exposition: &str, minutes: u64) -> Vec<Value> {
    const TARGET: &str = "job=\"fill-mirror\", instance=\"fill-mirror-0:8080\"";
    let mut series: Vec<Value> = samples(exposition)
        .map(|(series, value)| {
            let labelled = match series.split_once('{') {
                Some((name, labels)) => format!("{name}{{{TARGET}, {labels}"),
                None => format!("{series}{{{TARGET}}}"),
            };
            json!({"series": labelled, "values": format!("{value}x{minutes}")})
        })
        .collect();
    series.push(json!({"series": format!("up{{{TARGET}}}"), "values": format!("1x{minutes}")}));
    series
}

/// Runs promtool: after `minutes` of scrapes that all served `exposition`, `alert` fires with
/// exactly `labels` (none: it does not fire). Err holds what promtool said.
pub fn after_scrapes(
    exposition: &str,
    minutes: u64,
    alert: &str,
    labels: Option<Value>,
) -> Result<(), String> {
    let groups = rule_groups();
    let rule = alerts(&groups)
        .into_iter()
        .find(|a| a["alert"] == alert)
        .ok_or_else(|| format!("no alert {alert} in deploy/base/prometheus-rule.yaml"))?;
    let expected: Vec<Value> = labels
        .into_iter()
        .map(|labels| json!({"exp_labels": labels, "exp_annotations": rule["annotations"]}))
        .collect();
    let tests = json!({
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": input_series(exposition, minutes + 1),
            "alert_rule_test": [{
                "eval_time": format!("{minutes}m"),
                "alertname": alert,
                "exp_alerts": expected,
            }],
        }],
    });
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    // YAML is a superset of JSON: promtool reads both files as they are.
    std::fs::write(dir.path().join("rules.yaml"), groups.to_string()).map_err(|e| e.to_string())?;
    std::fs::write(dir.path().join("tests.yaml"), tests.to_string()).map_err(|e| e.to_string())?;
    let output = Command::new("promtool")
        .args(["test", "rules", "tests.yaml"])
        .current_dir(dir.path())
        .output()
        .map_err(|e| format!("promtool (Debian's prometheus package: make test-deps): {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}
