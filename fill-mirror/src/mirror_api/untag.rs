//! Removing one tag and nothing else, which only `fill-mirror prune --unanchor-only` does: the
//! OCI distribution spec's `DELETE /v2/<name>/manifests/<tag>` ("Deleting tags"). A registry MAY
//! refuse it (400 or 405), and many do (distribution before 3.0 answers `DIGEST_INVALID`, Harbor
//! `UNSUPPORTED`): the refusal is then the answer, never a deletion of the manifest instead.

use bytes::Bytes;
use http::Method;

use super::Mirror;

/// The most an error body read back may hold.
const ERROR_LIMIT: usize = 64 << 10;

impl Mirror {
    /// Removes `tag` from `repository` (`host/path`), leaving its manifest and every other tag
    /// that names it; a tag gone already is not a failure. A refusal names the registry's
    /// status and its error codes.
    pub async fn delete_tag(&self, repository: &str, tag: &str) -> Result<(), String> {
        if tag.starts_with("sha256:") || tag.contains(['/', '@', ':']) {
            return Err(format!(
                "{repository}: {tag:?} is not a tag: a digest would delete the manifest"
            ));
        }
        let rest = format!("manifests/{tag}");
        let answer = self
            .call(
                Method::DELETE,
                repository,
                &rest,
                &[],
                Bytes::new(),
                ERROR_LIMIT,
            )
            .await?;
        match answer.status {
            200 | 202 | 204 => Ok(()),
            404 => Ok(()),
            status => Err(format!(
                "DELETE {repository}/{rest}: {status}{}: the registry refuses to delete a tag{}",
                error_codes(&answer.body),
                match status {
                    400 | 405 =>
                        " (the OCI distribution spec lets a registry refuse so; the manifest was left as it is)",
                    _ => "",
                }
            )),
        }
    }
}

/// A registry error body's codes and messages (`{"errors":[{"code":…,"message":…}]}`), as
/// ` DIGEST_INVALID "provided digest did not match uploaded content"`; empty when it is none.
fn error_codes(body: &[u8]) -> String {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) else {
        return String::new();
    };
    let Some(errors) = value.get("errors").and_then(|e| e.as_array()) else {
        return String::new();
    };
    errors
        .iter()
        .map(|error| {
            let code = error.get("code").and_then(|c| c.as_str()).unwrap_or("?");
            match error.get("message").and_then(|m| m.as_str()) {
                Some(message) => format!(" {code} {message:?}"),
                None => format!(" {code}"),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registry_error_body_gives_its_codes_and_messages_and_anything_else_nothing() {
        let body = br#"{"errors":[{"code":"DIGEST_INVALID","message":"provided digest did not match uploaded content"}]}"#;
        assert_eq!(
            error_codes(body),
            " DIGEST_INVALID \"provided digest did not match uploaded content\""
        );
        assert_eq!(
            error_codes(br#"{"errors":[{"code":"UNSUPPORTED"}]}"#),
            " UNSUPPORTED"
        );
        assert_eq!(error_codes(b"<html>"), "");
        assert_eq!(error_codes(b"{}"), "");
    }
}
