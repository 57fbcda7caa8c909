//! The connection manager's decoder of CM private data (requests, replies,
//! refusals, leave messages from any rank that reaches the CM port). It
//! must not panic; a message it accepts encodes back to the bytes it read
//! (up to the length field: the IB CM pads private data), and decodes again
//! to itself.

#![no_main]

use libfuzzer_sys::fuzz_target;
use xrcbtl_xrc_conn::wire::Msg;

fuzz_target!(|data: &[u8]| {
    // The job the message names (so that decoding goes past the check),
    // and another one (which it must refuse).
    let named = data
        .get(8..12)
        .map_or(0, |b| u32::from_le_bytes(b.try_into().expect("4 bytes")));
    assert!(Msg::decode(data, named.wrapping_add(1)).is_err());
    let job = named;
    if let Ok(m) = Msg::decode(data, job) {
        let again = m.encode();
        assert_eq!(again.len(), m.len());
        assert_eq!(again[..], data[..again.len()], "{m:?}");
        assert_eq!(Msg::decode(&again, job), Ok(m));
    }
});
