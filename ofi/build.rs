//! Generates bindings to libfabric's public and provider headers (Debian
//! 12's libfabric-dev): the structs and ops tables the provider fills in,
//! and the constants of its contract. Only types and constants: the
//! provider calls no libfabric function but the logging ones, which
//! resolve in the libfabric that loads it.

use std::env;
use std::path::PathBuf;

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets it"));
    let header = manifest.join("src/wrapper.h");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed={}", header.display());
    bindgen::Builder::default()
        .header(header.to_str().expect("utf-8 path"))
        .allowlist_type("fi_.*|fid.*")
        .allowlist_var("FI_.*")
        .allowlist_function("fi_log.*")
        .allowlist_recursively(true)
        .prepend_enum_name(false)
        // Enums as plain integer constants: values a caller passes in can
        // never be out of range.
        .default_enum_style(bindgen::EnumVariation::Consts)
        .derive_default(true)
        .layout_tests(false)
        .generate_comments(false)
        .generate()
        .expect(
            "bindgen over rdma/fabric.h (install libfabric-dev and libclang-dev: scripts/setup)",
        )
        .write_to_file(out.join("fi_bindings.rs"))
        .expect("write bindings");
}
