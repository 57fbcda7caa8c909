//! The standalone benchmarks' out-of-band exchange: the hello line a
//! stranger or a peer sends to a rank's exchange port (or leaves in the
//! exchange directory). It must not panic, and a peer it accepts must
//! survive being written out and read back.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(why) = xrcbtl_benches::world::check_hello_roundtrip(data) {
        panic!("{why}");
    }
});
