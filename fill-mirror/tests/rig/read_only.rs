//! The binary run with a temporary folder nothing can be written to: TMPDIR a folder mounted
//! read-only in a mount namespace of the run's own (`unshare --map-root-user --mount`, util-
//! linux). A folder's mode would not do: the tests run as root here, and root writes through
//! any mode, not through a read-only mount.

use std::path::Path;
use std::process::{Command, Output};

/// `sh -c` glue: bind the folder (`$0`) on itself read-only, then run the rest.
const MOUNT_THEN_RUN: &str = r#"mount --bind -o ro "$0" "$0" && exec "$@""#;

fn under_read_only(tmpdir: &Path) -> Command {
    let mut command = Command::new("unshare");
    command
        .args(["--map-root-user", "--mount", "sh", "-c", MOUNT_THEN_RUN])
        .arg(tmpdir)
        .env("TMPDIR", tmpdir);
    command
}

/// `fill-mirror ARGS` with TMPDIR `tmpdir`, read-only; panics when the folder was writable
/// after all (a run that proves nothing).
pub fn run_with_read_only_tmpdir(args: &[&str], tmpdir: &Path) -> Output {
    let probe = under_read_only(tmpdir)
        .args(["sh", "-c", r#"echo written > "$TMPDIR/probe""#])
        .output()
        .expect("run unshare");
    assert!(
        !probe.status.success() && !tmpdir.join("probe").exists(),
        "the temporary folder {} could be written to: {}",
        tmpdir.display(),
        String::from_utf8_lossy(&probe.stderr)
    );
    under_read_only(tmpdir)
        .arg(env!("CARGO_BIN_EXE_fill-mirror"))
        .args(args)
        .args(["--log-format", "text"])
        .output()
        .expect("run fill-mirror under unshare")
}
