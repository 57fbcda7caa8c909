//! With the `verbs` feature: generates bindings to libibverbs and librdmacm
//! from the system headers, and compiles C wrappers for their static inline
//! functions (ibv_post_send, ibv_poll_cq, ibv_open_xrcd, ibv_create_srq_ex,
//! ...), which bindgen cannot call directly. Without the feature, nothing is
//! built and no rdma-core is needed.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "verbs")]
    verbs::generate();
}

#[cfg(feature = "verbs")]
mod verbs {
    use std::env;
    use std::path::PathBuf;

    pub fn generate() {
        let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
        let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets it"));
        let header = manifest.join("src/verbs/wrapper.h");
        println!("cargo:rerun-if-changed={}", header.display());
        let wrappers = out.join("verbs_static_fns");
        let bindings = bindgen::Builder::default()
            .header(header.to_str().expect("utf-8 path"))
            .allowlist_function("ibv_.*|___ibv_query_port|rdma_.*")
            .allowlist_type("ibv_.*|rdma_.*|sockaddr_ib")
            .allowlist_var("IBV_.*|RDMA_.*|RAI_.*|AF_IB")
            .blocklist_function("ibv_query_port")
            .allowlist_recursively(true)
            .prepend_enum_name(false)
            // Enums as plain integer constants: values read back from the
            // library (statuses, event types) can never be out of range.
            .default_enum_style(bindgen::EnumVariation::Consts)
            .derive_default(true)
            .wrap_static_fns(true)
            .wrap_static_fns_path(&wrappers)
            .layout_tests(false)
            .generate_comments(false)
            .generate()
            .expect("bindgen over infiniband/verbs.h and rdma/rdma_cma.h (install libibverbs-dev, librdmacm-dev, libclang-dev)");
        bindings
            .write_to_file(out.join("verbs_bindings.rs"))
            .expect("write bindings");
        cc::Build::new()
            .file(wrappers.with_extension("c"))
            .include(manifest.join("src/verbs"))
            .warnings(false)
            .compile("xrcbtl_verbs_static_fns");
        println!("cargo:rustc-link-lib=ibverbs");
        println!("cargo:rustc-link-lib=rdmacm");
    }
}
