//! The policy file parser over arbitrary text: refuses what it cannot load, never panics.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = kernel::policy::Policy::from_yaml(text);
    }
});
