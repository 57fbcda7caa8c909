//! The libfabric provider's decoder of a peer's message header. It may not
//! panic, and whatever it accepts encodes back to the very bytes it read
//! (one encoding per message), with the rest as the payload.

#![no_main]

use libfuzzer_sys::fuzz_target;
use xrcbtl_ofi::wire::Msg;

fuzz_target!(|data: &[u8]| {
    if let Ok((m, payload)) = Msg::decode(data) {
        let mut out = Vec::new();
        m.encode(&mut out);
        assert_eq!(out.len(), m.len(), "{m:?}");
        assert_eq!(out[..], data[..m.len()], "{m:?}");
        assert_eq!(payload, &data[m.len()..], "{m:?}");
    }
});
