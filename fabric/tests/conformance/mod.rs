//! The fabric conformance suite: one rule per behaviour of verbs, XRC, iWARP
//! and the RDMA CM that xrcbtl relies on, written against the fabric traits
//! only, so that every provider runs the same rules. A provider declares what
//! it cannot show (from its device caps, or because it lacks fault injection)
//! and those rules are listed as skipped with the reason.

#![allow(dead_code)]

pub mod harness;
pub mod util;

mod atomics;
mod cm;
mod data;
mod faults;
mod ibcm;
mod iwarp;
mod xrc;

use std::process::ExitCode;
use std::sync::Arc;

use harness::{Harness, Need, Outcome};

/// One rule of the suite.
pub struct Rule<H> {
    /// Test name.
    pub name: &'static str,
    /// What the provider must offer for the rule to run.
    pub needs: &'static [Need],
    /// The check.
    pub run: fn(&H) -> Outcome,
}

/// Shorthand for building a rule.
pub fn rule<H>(name: &'static str, needs: &'static [Need], run: fn(&H) -> Outcome) -> Rule<H> {
    Rule { name, needs, run }
}

/// Every rule.
pub fn rules<H: Harness>() -> Vec<Rule<H>> {
    let mut v = Vec::new();
    v.extend(data::rules());
    v.extend(atomics::rules());
    v.extend(cm::rules());
    v.extend(ibcm::rules());
    v.extend(xrc::rules());
    v.extend(iwarp::rules());
    v.extend(faults::rules());
    v
}

/// Builds a fresh harness for one rule.
pub type Factory<H> = Arc<dyn Fn() -> Result<H, String> + Send + Sync>;

/// Runs the suite for each configuration under libtest-mimic: every rule of
/// every configuration is a test named `config::rule`; rules a configuration
/// cannot show are ignored, and listed with their reasons first.
pub fn run_suite<H: Harness>(configs: Vec<(String, Factory<H>)>) -> ExitCode {
    let args = libtest_mimic::Arguments::from_args();
    let mut trials = Vec::new();
    for (config, factory) in configs {
        // One harness to read the gaps; each rule gets its own.
        let probe = match factory() {
            Ok(h) => Some(h),
            Err(e) => {
                let msg = format!("{config}: cannot set up: {e}");
                eprintln!("conformance: {msg}");
                trials.push(libtest_mimic::Trial::test(
                    format!("{config}::setup"),
                    move || Err(msg.clone().into()),
                ));
                None
            }
        };
        let Some(probe) = probe else { continue };
        let all = rules::<H>();
        let mut skipped = Vec::new();
        for r in &all {
            let gap = r.needs.iter().find_map(|n| probe.gap(*n));
            if let Some(reason) = &gap {
                skipped.push(format!("  skip {config}::{}: {reason}", r.name));
            }
            let factory = factory.clone();
            let run = r.run;
            let needs = r.needs;
            let name = format!("{config}::{}", r.name);
            let label = name.clone();
            let trial = libtest_mimic::Trial::test(name, move || {
                let h = factory().map_err(|e| format!("{label}: setup: {e}"))?;
                if let Some(reason) = needs.iter().find_map(|n| h.gap(*n)) {
                    println!("{label}: skipped: {reason}");
                    return Ok(());
                }
                run(&h).map_err(|f| format!("{} [{}]: {}", label, h.label(), f.0))?;
                // Whatever the rule left behind must be consistent.
                h.check().map_err(|e| {
                    format!(
                        "{} [{}]: invariant broken after the rule: {e}",
                        label,
                        h.label()
                    )
                    .into()
                })
            })
            .with_ignored_flag(gap.is_some());
            trials.push(trial);
        }
        eprintln!(
            "conformance: {config} ({}): {} rules, {} run, {} skipped",
            probe.label(),
            all.len(),
            all.len() - skipped.len(),
            skipped.len()
        );
        for s in skipped {
            eprintln!("{s}");
        }
        for d in harness::Deviation::ALL {
            if let Some(why) = probe.deviation(*d) {
                eprintln!("  known deviation {config}: {d:?}: {why}");
            }
        }
    }
    libtest_mimic::run(&args, trials).exit_code()
}

/// Two processes of a harness.
pub type ProcPair<H> = (
    harness::Proc<<H as Harness>::F>,
    harness::Proc<<H as Harness>::F>,
);

/// Two processes: on nodes 0 and 1, or both on node 0 if there is one node.
pub fn two<H: Harness>(h: &H) -> Result<ProcPair<H>, harness::Failure> {
    let a = h.spawn(0).map_err(harness::Failure)?;
    let b = h
        .spawn(if h.nodes() > 1 { 1 } else { 0 })
        .map_err(harness::Failure)?;
    Ok((a, b))
}
