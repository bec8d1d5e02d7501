//! A registry far away: a TCP proxy on loopback in front of a real registry that adds network
//! round trips where a real network would. A new connection costs two (TCP, then the TLS
//! handshake a real mirror over HTTPS needs), and every request one more: a lookup by the host
//! (new connection, `GET /v2/`, `HEAD`) then costs four, as measured against a real mirror.
//! The delay is in the network path only; nothing in the policy or the host sleeps.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

/// Round trips a new connection costs before its first request: TCP and TLS handshakes.
pub const CONNECT_ROUND_TRIPS: u32 = 2;

pub struct LatencyProxy {
    /// `127.0.0.1:PORT`: use it as the registry host in image names.
    pub host: String,
    pub round_trip: Duration,
    stop: Arc<AtomicBool>,
}

impl LatencyProxy {
    pub fn start(upstream: &str, round_trip: Duration) -> anyhow::Result<LatencyProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let host = listener.local_addr()?.to_string();
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let upstream = upstream.to_string();
        let stopping = stop.clone();
        thread::spawn(move || {
            while !stopping.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let upstream = upstream.clone();
                        thread::spawn(move || relay(client, &upstream, round_trip));
                    }
                    Err(_) => thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        Ok(LatencyProxy {
            host,
            round_trip,
            stop,
        })
    }
}

impl Drop for LatencyProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn relay(client: TcpStream, upstream: &str, round_trip: Duration) {
    let _ = client.set_nonblocking(false);
    thread::sleep(round_trip * CONNECT_ROUND_TRIPS);
    let Ok(server) = TcpStream::connect(upstream) else {
        return;
    };
    let (Ok(client_out), Ok(server_in)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    // A request costs a round trip when it is the first on the connection or follows an
    // answer; the further reads of one request do not.
    let answered = Arc::new(AtomicBool::new(true));
    let answered_by_server = answered.clone();
    let to_client = thread::spawn(move || {
        pipe(server_in, client_out, |_| {
            answered_by_server.store(true, Ordering::Relaxed);
        })
    });
    pipe(client, server, |_| {
        if answered.swap(false, Ordering::Relaxed) {
            thread::sleep(round_trip);
        }
    });
    let _ = to_client.join();
}

/// Copies `from` to `to` until either side closes, calling `before_write` with each chunk.
fn pipe(mut from: TcpStream, mut to: TcpStream, mut before_write: impl FnMut(&[u8])) {
    let mut buffer = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                before_write(&buffer[..n]);
                if to.write_all(&buffer[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}
