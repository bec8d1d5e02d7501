//! Artifact Registry: an access token of the Pod's Google service account (Workload Identity)
//! from the GKE metadata server.

use std::time::{Duration, SystemTime};

use base64::Engine;
use serde::Deserialize;

use super::{Token, refresh_at};

/// The GKE metadata server, unless `GCE_METADATA_HOST` names another (as Google's libraries
/// read it: a host and port, no scheme).
pub(super) const METADATA_HOST: &str = "metadata.google.internal";
const METADATA_TOKEN_PATH: &str = "/computeMetadata/v1/instance/service-accounts/default/token";
/// Artifact Registry's user name for an OAuth access token.
const GAR_USER: &str = "oauth2accesstoken";

/// The metadata server's answer (`expires_in` in seconds).
#[derive(Deserialize)]
struct MetadataToken {
    access_token: String,
    expires_in: u64,
}

/// An access token of the node's (the Pod's, with Workload Identity) service account from the
/// metadata server at `base`, as Artifact Registry's password for `oauth2accesstoken`.
pub(super) async fn gar_token(base: &str, host: &str) -> Result<Token, String> {
    use http_body_util::BodyExt;
    let url = format!("{base}{METADATA_TOKEN_PATH}");
    let failed = |what: String| format!("--gar-registry {host}: the metadata server {url}: {what}");
    let request = http::Request::get(&url)
        .header("Metadata-Flavor", "Google")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .map_err(|e| failed(e.to_string()))?;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    let answer = tokio::time::timeout(Duration::from_secs(10), async {
        let response = client.request(request).await.map_err(|e| e.to_string())?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok::<_, String>((status, body))
    })
    .await
    .map_err(|_| failed("no answer within 10 s".to_string()))?
    .map_err(failed)?;
    let (status, body) = answer;
    if !status.is_success() {
        return Err(failed(format!(
            "HTTP {status}: {}",
            String::from_utf8_lossy(&body).trim()
        )));
    }
    let token: MetadataToken =
        serde_json::from_slice(&body).map_err(|e| failed(format!("not a token answer ({e})")))?;
    let now = SystemTime::now();
    let expires = now + Duration::from_secs(token.expires_in);
    let auth = base64::engine::general_purpose::STANDARD
        .encode(format!("{GAR_USER}:{}", token.access_token));
    Ok(Token {
        auth,
        refresh: refresh_at(now, expires),
        expires,
    })
}
