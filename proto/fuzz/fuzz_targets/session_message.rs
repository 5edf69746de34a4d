//! Decoding a worker's session message from arbitrary bytes: never panics, and what decodes
//! encodes and decodes again to the same message.

#![no_main]

use kernel_proto::v1::OpenSessionRequest;
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let Ok(message) = OpenSessionRequest::decode(data) else {
        return;
    };
    let bytes = message.encode_to_vec();
    let again = OpenSessionRequest::decode(bytes.as_slice()).expect("re-encoded message decodes");
    assert_eq!(message, again);
});
