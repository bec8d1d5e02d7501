//! A TCP proxy on loopback in front of the API server, for the watch's hard cases: it can hold
//! back what the API server sends (so that the watch sees a change late, while the client's
//! own requests reach the server at once), and it can cut every connection and refuse new
//! ones for a while (so that the watch must resume later, from a revision that may be gone).
//! TLS passes through untouched: the API server's certificate names 127.0.0.1, whatever port.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

pub struct ApiProxy {
    pub port: u16,
    state: Arc<State>,
}

struct State {
    upstream: String,
    /// How long what the server sends is held back, in milliseconds.
    delay_ms: AtomicU64,
    /// While set, every connection is closed at once.
    cut: AtomicBool,
    open: Mutex<Vec<TcpStream>>,
    stopped: AtomicBool,
}

impl ApiProxy {
    pub fn start(upstream_port: u16) -> ApiProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let port = listener.local_addr().expect("its address").port();
        let state = Arc::new(State {
            upstream: format!("127.0.0.1:{upstream_port}"),
            delay_ms: AtomicU64::new(0),
            cut: AtomicBool::new(false),
            open: Mutex::new(Vec::new()),
            stopped: AtomicBool::new(false),
        });
        let shared = state.clone();
        thread::spawn(move || {
            for client in listener.incoming() {
                if shared.stopped.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                if shared.cut.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(&shared.upstream) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                connect(&shared, client, server);
            }
        });
        ApiProxy { port, state }
    }

    /// What the API server sends reaches the client `delay` late from now on.
    pub fn hold_back(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.state.delay_ms.store(ms, Ordering::SeqCst);
    }

    /// Closes every connection, and every new one until [`ApiProxy::restore`].
    pub fn cut(&self) {
        self.state.cut.store(true, Ordering::SeqCst);
        let mut open = self.state.open.lock().unwrap_or_else(|p| p.into_inner());
        for stream in open.drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    pub fn restore(&self) {
        self.state.cut.store(false, Ordering::SeqCst);
    }

    /// A copy of `kubeconfig` whose server is this proxy, written to `path`.
    pub fn kubeconfig(&self, kubeconfig: &std::path::Path, path: &std::path::Path) {
        let text = std::fs::read_to_string(kubeconfig).expect("the kubeconfig");
        let text = text.replace(
            &format!("server: https://{}", self.state.upstream),
            &format!("server: https://127.0.0.1:{}", self.port),
        );
        assert!(
            text.contains(&format!("127.0.0.1:{}", self.port)),
            "the kubeconfig names no server https://{}",
            self.state.upstream
        );
        std::fs::write(path, text).expect("write the kubeconfig");
    }
}

impl Drop for ApiProxy {
    fn drop(&mut self) {
        self.state.stopped.store(true, Ordering::SeqCst);
        self.cut();
        // Wakes the accepting thread so that it sees `stopped`.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn connect(state: &Arc<State>, client: TcpStream, server: TcpStream) {
    let mut open = state.open.lock().unwrap_or_else(|p| p.into_inner());
    for stream in [&client, &server] {
        if let Ok(clone) = stream.try_clone() {
            open.push(clone);
        }
    }
    drop(open);
    let (Ok(mut client_reader), Ok(mut server_writer)) = (client.try_clone(), server.try_clone())
    else {
        return;
    };
    // The client's requests: at once.
    thread::spawn(move || {
        let _ = std::io::copy(&mut client_reader, &mut server_writer);
        let _ = server_writer.shutdown(Shutdown::Write);
    });
    // The server's answers and watch events: each chunk due `delay` after it was read, in order.
    let (due, queued) = mpsc::channel::<(Instant, Vec<u8>)>();
    let reader_state = state.clone();
    let mut server_reader = server;
    thread::spawn(move || {
        let mut buffer = [0u8; 16 * 1024];
        loop {
            match server_reader.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let delay = Duration::from_millis(reader_state.delay_ms.load(Ordering::SeqCst));
                    if due
                        .send((Instant::now() + delay, buffer[..n].to_vec()))
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
    });
    let mut client_writer = client;
    thread::spawn(move || {
        for (at, bytes) in queued {
            thread::sleep(at.saturating_duration_since(Instant::now()));
            if client_writer.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = client_writer.shutdown(Shutdown::Write);
    });
}
