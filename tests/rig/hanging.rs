//! A registry that hangs: it accepts connections, reads the requests, never answers, and drops
//! each connection after `hold`. A dead backend behind a load balancer does this; a firewall that
//! drops packets is similar for about two minutes per connection. Kubewarden's host has no
//! connect or read timeout (KUBEWARDEN.md, "A registry that hangs"), so a lookup there lasts
//! until the connection dies: `hold` stands for that moment, finite so that the tests end.

use std::io::Read;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

pub struct HangingRegistry {
    /// `127.0.0.1:PORT`: use it as the registry host in image names.
    pub host: String,
    stop: Arc<AtomicBool>,
    accepted: Arc<AtomicUsize>,
}

impl HangingRegistry {
    pub fn start(hold: Duration) -> anyhow::Result<HangingRegistry> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let host = listener.local_addr()?.to_string();
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counting = accepted.clone();
        thread::spawn(move || {
            while !stopping.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((connection, _)) => {
                        counting.fetch_add(1, Ordering::Relaxed);
                        thread::spawn(move || hold_then_drop(connection, hold));
                    }
                    Err(_) => thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        Ok(HangingRegistry {
            host,
            stop,
            accepted,
        })
    }

    /// How many connections it has accepted so far.
    pub fn connections(&self) -> usize {
        self.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for HangingRegistry {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Reads whatever the client sends and answers nothing until `hold` has passed.
fn hold_then_drop(mut connection: TcpStream, hold: Duration) {
    let until = Instant::now() + hold;
    let _ = connection.set_nonblocking(false);
    let mut buffer = [0u8; 4096];
    while let Some(left) = until.checked_duration_since(Instant::now()) {
        let _ = connection.set_read_timeout(Some(left.max(Duration::from_millis(1))));
        match connection.read(&mut buffer) {
            Ok(0) => break,
            Ok(_) => {}
            Err(_) => {}
        }
    }
    let _ = connection.shutdown(Shutdown::Both);
}
