//! Runs the built policy on an admission request, as `kwctl run` would, in the test rig's wasm
//! host. By default the OCI lookups are replayed from a kwctl session file; with `--live` a real
//! registry is started on loopback, filled with the images the session says the mirror holds,
//! and asked instead.
//!
//! `cargo run --example run -- [--settings F] [--request F] [--session F] [--live]`

#[path = "../tests/rig/mod.rs"]
mod rig;

use std::path::PathBuf;
use std::process::ExitCode;

use rig::hosts::{LiveHost, ReplayHost, locate};
use rig::images::Image;
use rig::registry::TestRegistry;
use rig::wapc::SharedHost;
use serde_json::Value;

struct Options {
    settings: PathBuf,
    request: PathBuf,
    session: PathBuf,
    live: bool,
}

fn options() -> Result<Options, String> {
    let mut options = Options {
        settings: rig::root().join("examples/settings.yml"),
        request: rig::root().join("examples/pod.json"),
        session: rig::root().join("examples/session.yml"),
        live: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next()
                .map(PathBuf::from)
                .ok_or(format!("{arg} needs a value"))
        };
        match arg.as_str() {
            "--settings" => options.settings = value()?,
            "--request" => options.request = value()?,
            "--session" => options.session = value()?,
            "--live" => options.live = true,
            other => {
                return Err(format!(
                    "unknown argument {other:?}; use --settings, --request, --session, --live"
                ));
            }
        }
    }
    Ok(options)
}

/// A path as the user would type it from the repository root.
fn shown(path: &std::path::Path) -> String {
    path.strip_prefix(rig::root())
        .unwrap_or(path)
        .display()
        .to_string()
}

fn main() -> ExitCode {
    let options = match options() {
        Ok(options) => options,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(2);
        }
    };
    let mut settings = rig::read_yaml(&options.settings);
    let request = rig::read_json(&options.request);
    let replay = ReplayHost::load(&options.session)
        .unwrap_or_else(|e| panic!("{}: {e:#}", shown(&options.session)));
    println!(
        "settings: {}\nrequest:  {}",
        shown(&options.settings),
        shown(&options.request)
    );

    let mut registry = None;
    let live = rig::shared(LiveHost::default());
    let replay = rig::shared(replay);
    let host: SharedHost = if options.live {
        let mirror =
            TestRegistry::start("example").expect("start the loopback registry (make deps)");
        let mut seeded = Vec::new();
        for exchange in replay
            .lock()
            .unwrap()
            .pending()
            .filter(|e| e.answer.is_ok())
        {
            // Tags only: an image pushed by the example cannot have a recorded digest.
            if let Ok((host, repository, tag)) = locate(&exchange.image)
                && !tag.contains(':')
            {
                Image::new(&exchange.image, "linux/amd64").push(&mirror, &repository, Some(&tag));
                seeded.push(host);
            }
        }
        // The mirror host of the settings is played by the loopback registry.
        let rewritten = serde_json::to_string(&settings).unwrap_or_default();
        let rewritten = seeded.iter().fold(rewritten, |text, host| {
            text.replace(&format!("\"{host}"), &format!("\"{}", mirror.host))
        });
        settings = serde_json::from_str(&rewritten).expect("settings stay JSON");
        println!(
            "host:     live, a registry on {} standing in for {:?}, seeded from {}",
            mirror.host,
            seeded.first().map(String::as_str).unwrap_or("the mirror"),
            shown(&options.session)
        );
        registry = Some(mirror);
        live.clone()
    } else {
        println!(
            "host:     replaying {} ({} recorded lookups)",
            shown(&options.session),
            replay.lock().unwrap().remaining()
        );
        replay.clone()
    };

    let (valid, message) = rig::validate_settings(&settings);
    if !valid {
        println!(
            "Provided settings are not valid: {}",
            message.unwrap_or_default()
        );
        return ExitCode::FAILURE;
    }
    let response = rig::validate(&settings, &request, host);
    println!("allowed:  {}", response.accepted);
    if let Some(message) = &response.message {
        println!("message:  {message}");
    }
    let original = &request["object"];
    for list in ["containers", "initContainers", "ephemeralContainers"] {
        let containers = original["spec"][list]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for (index, container) in containers.iter().enumerate() {
            let before = container["image"].as_str().unwrap_or_default();
            let name = container["name"].as_str().unwrap_or_default();
            match response.image(list, index).filter(|after| *after != before) {
                Some(after) => println!("  {list}[{index}] {name}: {before}\n      -> {after}"),
                None => println!("  {list}[{index}] {name}: {before} (unchanged)"),
            }
        }
    }
    if let Some(pod) = &response.mutated {
        if let Some(secrets) = pod["spec"].get("imagePullSecrets") {
            println!("imagePullSecrets: {secrets}");
        }
        for (field, shown) in [("annotations", "annotation"), ("labels", "label")] {
            if let Some(entries) = pod["metadata"].get(field).and_then(Value::as_object) {
                for (key, value) in entries {
                    println!("{shown} {key}: {}", value.as_str().unwrap_or_default());
                }
            }
        }
    }
    for warning in &response.warnings {
        println!("warning:  {warning}");
    }
    for (key, value) in &response.audit {
        println!("audit:    {key}={value}");
    }
    let lookups = if options.live {
        live.lock().unwrap().lookups()
    } else {
        replay.lock().unwrap().calls.clone()
    };
    println!("lookups:  {}", lookups.len());
    for lookup in &lookups {
        println!("  {lookup}");
    }
    drop(registry);
    // Every lookup failing is the host, not the policy: a registry that did not start, a
    // session that does not match the request. Say so, and fail, rather than show a Pod kept.
    let answered = if options.live {
        live.lock()
            .unwrap()
            .exchanges
            .iter()
            .filter(|e| e.answer.is_ok())
            .count()
    } else {
        let replay = replay.lock().unwrap();
        if replay.unexpected > 0 {
            eprintln!(
                "error: {} lookups were not in {}",
                replay.unexpected,
                shown(&options.session)
            );
            return ExitCode::FAILURE;
        }
        lookups.len()
    };
    if !lookups.is_empty() && answered == 0 {
        eprintln!("error: every lookup failed: the host, not the policy, is at fault");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
