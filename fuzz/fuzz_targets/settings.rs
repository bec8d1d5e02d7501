//! Settings validation: no panic on any input, every refusal says something, and valid
//! settings survive a serialisation round trip.
#![no_main]

use image_swapper_policy::policy::Policy;
use image_swapper_policy::settings::parse_settings;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let settings = match parse_settings(data) {
        Ok(settings) => settings,
        Err(message) => {
            assert!(!message.is_empty());
            return;
        }
    };
    match Policy::from_settings(&settings) {
        Ok(_) => {
            let json = serde_json::to_vec(&settings).expect("settings serialise");
            let again = parse_settings(&json).expect("serialised settings parse");
            assert_eq!(again, settings);
            assert!(Policy::from_settings(&again).is_ok());
        }
        Err(message) => assert!(message.contains(": "), "{message}"),
    }
});
