//! Content digests (`sha256:<hex>`, OCI image-spec "Digests"): of bytes in hand, and checked
//! as a body streams by, so that a truncated or altered blob is a failure without ever being
//! held whole. A file of its own because the copy's companions (`attached.rs`) and the warming
//! (`warm.rs`) both name content by it.

use sha2::{Digest, Sha256, Sha512};

/// `sha256:<hex>` of `bytes`.
pub fn digest_of(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

/// The two algorithms OCI registers (image-spec `descriptor.md`).
enum Hasher {
    Sha256(Sha256),
    Sha512(Sha512),
}

/// A body checked against the digest and size a descriptor names, chunk by chunk.
pub struct Streamed {
    hasher: Hasher,
    expected: String,
    size: Option<u64>,
    seen: u64,
}

impl Streamed {
    /// A check of `expected` (`algorithm:hex`), `size` bytes long when known; an algorithm
    /// other than sha256 or sha512, or a malformed digest, cannot be checked and is refused.
    pub fn new(expected: &str, size: Option<u64>) -> Result<Streamed, String> {
        let (hasher, length) = match expected.split_once(':') {
            Some(("sha256", _)) => (Hasher::Sha256(Sha256::new()), 64),
            Some(("sha512", _)) => (Hasher::Sha512(Sha512::new()), 128),
            _ => return Err(format!("{expected:?}: not a sha256 or sha512 digest")),
        };
        let hex = expected.split_once(':').map_or("", |(_, hex)| hex);
        if hex.len() != length
            || !hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(format!("{expected:?}: not a sha256 or sha512 digest"));
        }
        Ok(Streamed {
            hasher,
            expected: expected.to_string(),
            size,
            seen: 0,
        })
    }

    /// One more chunk; an error as soon as the body is longer than its size.
    pub fn update(&mut self, chunk: &[u8]) -> Result<(), String> {
        self.seen += chunk.len() as u64;
        if let Some(size) = self.size
            && self.seen > size
        {
            return Err(format!(
                "{}: more than the {size} bytes its descriptor names",
                self.expected
            ));
        }
        match &mut self.hasher {
            Hasher::Sha256(hasher) => hasher.update(chunk),
            Hasher::Sha512(hasher) => hasher.update(chunk),
        }
        Ok(())
    }

    /// The bytes seen so far.
    pub fn seen(&self) -> u64 {
        self.seen
    }

    /// The end of the body: its length and digest must be the ones named.
    pub fn finish(self) -> Result<(), String> {
        if let Some(size) = self.size
            && self.seen != size
        {
            return Err(format!(
                "{}: {} bytes came of the {size} its descriptor names",
                self.expected, self.seen
            ));
        }
        let got = match self.hasher {
            Hasher::Sha256(hasher) => format!("sha256:{:x}", hasher.finalize()),
            Hasher::Sha512(hasher) => format!("sha512:{:x}", hasher.finalize()),
        };
        if got != self.expected {
            return Err(format!(
                "{}: the bytes that came are {got}, not the content named",
                self.expected
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(expected: &str, size: Option<u64>, chunks: &[&[u8]]) -> Result<(), String> {
        let mut streamed = Streamed::new(expected, size)?;
        for chunk in chunks {
            streamed.update(chunk)?;
        }
        streamed.finish()
    }

    #[test]
    fn a_body_is_checked_whatever_its_chunks() {
        let whole = digest_of(b"layer bytes");
        assert_eq!(check(&whole, Some(11), &[b"layer", b" ", b"bytes"]), Ok(()));
        assert_eq!(check(&whole, None, &[b"layer bytes"]), Ok(()));
        let sha512 = format!("sha512:{:x}", Sha512::digest(b"layer bytes"));
        assert_eq!(check(&sha512, Some(11), &[b"layer ", b"bytes"]), Ok(()));
    }

    #[rstest::rstest]
    #[case::truncated(&["layer"], "5 bytes came of the 11")]
    #[case::altered(&["layer BYTES"], "not the content named")]
    #[case::longer(&["layer bytes", "!"], "more than the 11 bytes")]
    fn a_body_that_is_not_the_content_named_fails(#[case] chunks: &[&str], #[case] words: &str) {
        let chunks: Vec<&[u8]> = chunks.iter().map(|c| c.as_bytes()).collect();
        let error = check(&digest_of(b"layer bytes"), Some(11), &chunks).unwrap_err();
        assert!(error.contains(words), "{error}");
    }

    #[rstest::rstest]
    #[case::another_algorithm("md5:00")]
    #[case::short_hex("sha256:abc")]
    #[case::upper_case("sha256:ABCDEF0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF0123456789")]
    fn a_digest_that_cannot_be_checked_is_refused(#[case] digest: &str) {
        assert!(Streamed::new(digest, None).is_err());
    }
}
