//! The C ABI's decoder of the address a peer publishes through the MPI
//! library's exchange (the modex). It must not panic, and what it accepts
//! encodes back to the very bytes it read.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(why) = xrcbtl::check_address_roundtrip(data) {
        panic!("{why}");
    }
});
