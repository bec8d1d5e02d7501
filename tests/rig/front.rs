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

/// A registry relay on loopback in front of `upstream` (`127.0.0.1:PORT`, plain HTTP) that
/// answers a request itself when `refuse(method, url)` gives a status and a body, and relays
/// every other. Its `127.0.0.1:PORT` (a TLS handshake closed at once, as skopeo
/// `--tls-verify=false` wants) and the flag that stops it.
pub fn relay(
    name: &str,
    upstream: &str,
    refuse: impl Fn(&str, &str) -> Option<(u16, String)> + Send + 'static,
) -> anyhow::Result<(String, Arc<AtomicBool>)> {
    let gate = std::net::TcpListener::bind("127.0.0.1:0")?;
    let host = gate.local_addr()?.to_string();
    let agent = ureq::AgentBuilder::new()
        .redirects(0)
        .timeout(Duration::from_secs(30))
        .build();
    let (upstream, outer) = (upstream.to_string(), host.clone());
    let (inner, stop) = serve(name, move |mut request| {
        let method = request.method().as_str().to_string();
        let url = request.url().to_string();
        if let Some((code, body)) = refuse(&method, &url) {
            let length = body.len();
            // Retry-After 0: skopeo's own retries of a 429 give up at once.
            let headers = [("Content-Type", "application/json"), ("Retry-After", "0")]
                .iter()
                .filter_map(|(name, value)| tiny_http::Header::from_bytes(*name, *value).ok())
                .collect();
            let _ = request.respond(tiny_http::Response::new(
                code.into(),
                headers,
                std::io::Cursor::new(body.into_bytes()),
                Some(length),
                None,
            ));
            return;
        }
        let mut forwarded = agent.request(&method, &format!("http://{upstream}{url}"));
        for header in request.headers() {
            let field = header.field.as_str().as_str();
            if ["content-type", "content-range", "accept", "authorization"]
                .contains(&field.to_ascii_lowercase().as_str())
            {
                forwarded = forwarded.set(field, header.value.as_str());
            }
        }
        let mut body = Vec::new();
        let _ = std::io::Read::read_to_end(request.as_reader(), &mut body);
        let reply = match forwarded.send_bytes(&body) {
            Ok(reply) | Err(ureq::Error::Status(_, reply)) => reply,
            Err(_) => {
                let _ = request.respond(tiny_http::Response::empty(502));
                return;
            }
        };
        let code = reply.status();
        let length: usize = reply
            .header("Content-Length")
            .and_then(|l| l.parse().ok())
            .unwrap_or(0);
        let headers: Vec<tiny_http::Header> = reply
            .headers_names()
            .into_iter()
            .filter(|name| {
                !["content-length", "transfer-encoding", "connection", "date"]
                    .contains(&name.to_ascii_lowercase().as_str())
            })
            .filter_map(|name| {
                let value = reply.header(&name)?.replace(&upstream, &outer);
                tiny_http::Header::from_bytes(name.as_bytes(), value.as_bytes()).ok()
            })
            .collect();
        let mut data = Vec::new();
        let _ = std::io::Read::read_to_end(&mut reply.into_reader(), &mut data);
        let length = if method == "HEAD" { length } else { data.len() };
        let _ = request.respond(tiny_http::Response::new(
            code.into(),
            headers,
            std::io::Cursor::new(data),
            Some(length),
            None,
        ));
    })?;
    super::ecr::plain_http_gate(gate, &inner, stop.clone())?;
    Ok((host, stop))
}
