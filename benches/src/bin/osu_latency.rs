//! `osu_latency` over the xrcbtl BTL (see the crate documentation and `--help`).

fn main() {
    xrcbtl_benches::osu::main(xrcbtl_benches::Bench::Latency);
}
