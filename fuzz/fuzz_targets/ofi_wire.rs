//! The libfabric provider's decoders of what peers and callers hand it: a
//! peer's message header, and an endpoint address given to `fi_av_insert`.
//! Neither may panic, and whatever they accept encodes back to the very
//! bytes they read (one encoding each), a message header with the rest as
//! its payload.

#![no_main]

use libfuzzer_sys::fuzz_target;
use xrcbtl_ofi::addr::EpAddr;
use xrcbtl_ofi::wire::Msg;

fuzz_target!(|data: &[u8]| {
    if let Ok((m, payload)) = Msg::decode(data) {
        let mut out = Vec::new();
        m.encode(&mut out);
        assert_eq!(out.len(), m.len(), "{m:?}");
        assert_eq!(out[..], data[..m.len()], "{m:?}");
        assert_eq!(payload, &data[m.len()..], "{m:?}");
    }
    if let Ok(a) = EpAddr::decode(data) {
        assert_eq!(a.encode()[..], data[..], "{a:?}");
    }
});
