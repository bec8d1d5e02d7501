//! An HTTP front on loopback for the rig's registry stand-ins (an ECR pull-through cache, ECR's
//! registry endpoint): tiny_http answering each request with `answer`, on a thread of its own,
//! until the returned flag is set.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

/// Starts the front; its `127.0.0.1:PORT` and the flag that stops it.
pub fn serve(
    name: &str,
    answer: impl Fn(tiny_http::Request) + Send + 'static,
) -> anyhow::Result<(String, Arc<AtomicBool>)> {
    let server =
        tiny_http::Server::http("127.0.0.1:0").map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
    let host = server
        .server_addr()
        .to_ip()
        .ok_or_else(|| anyhow::anyhow!("{name} has no IP address"))?
        .to_string();
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = stop.clone();
    thread::spawn(move || {
        while !stopping.load(Ordering::Relaxed) {
            if let Ok(Some(request)) = server.recv_timeout(Duration::from_millis(50)) {
                answer(request);
            }
        }
    });
    Ok((host, stop))
}
