//! `osu_latency` over the xrcbtl BTL (see the crate documentation and `--help`).

#![forbid(unsafe_code)]

fn main() {
    xrcbtl_benches::osu::main(xrcbtl_benches::Bench::Latency);
}
