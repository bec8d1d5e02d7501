//! Reference parsing and `exclude` globs: no panic on any string, normalising is idempotent,
//! and a glob of `*` matches everything.
#![no_main]

use image_swapper_policy::glob::Glob;
use image_swapper_policy::reference::Reference;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(reference) = Reference::parse(text) {
        let normalised = reference.to_string();
        let again = Reference::parse(&normalised).expect("a normalised reference parses");
        assert_eq!(again, reference, "normalising twice changes nothing");
    }
    // The first line is a pattern, the rest the text it is matched against.
    let (pattern, subject) = text.split_once('\n').unwrap_or((text, ""));
    if let Ok(glob) = Glob::new(pattern) {
        let _ = glob.matches(subject);
    }
    let star = Glob::new("*").expect("valid");
    assert!(star.matches(text));
});
