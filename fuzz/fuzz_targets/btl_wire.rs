//! The BTL's decoders of what a peer sends in a message: the header, the
//! rendezvous control payloads, and a packed remote-memory handle. None
//! may panic; whatever one accepts encodes back to the very bytes it read
//! (the formats have one encoding each), so nothing is accepted loosely.

#![no_main]

use libfuzzer_sys::fuzz_target;
use xrcbtl_btl::wire::{self, Header, Rtr, Rts, HEADER};
use xrcbtl_btl::RemoteMem;

fuzz_target!(|data: &[u8]| {
    if let Some(h) = Header::decode(data) {
        assert_eq!(h.len as usize, data.len() - HEADER, "{h:?}");
        let mut out = [0u8; HEADER];
        h.encode(&mut out);
        assert_eq!(out[..], data[..HEADER], "{h:?}");
    }
    if let Some(r) = Rts::decode(data) {
        assert_eq!(r.encode()[..], *data, "{r:?}");
    }
    if let Some(r) = Rtr::decode(data) {
        assert_eq!(r.encode()[..], *data, "{r:?}");
    }
    if let Some(m) = wire::decode_msg_id(data) {
        assert_eq!(wire::encode_msg_id(m)[..], *data);
    }
    if let Some(m) = RemoteMem::unpack(data) {
        assert_eq!(m.pack()[..], *data, "{m:?}");
        assert!(m.addr.checked_add(m.len).is_some(), "{m:?}");
    }
});
