//! The xrcbtl byte transfer layer: puts the fabric, the connection manager
//! (and, with the data path, the registration cache and the progress engine)
//! together.
//!
//! [`conn::ConnDriver`] runs the XRC connection manager against a fabric: it
//! owns the verbs objects (INI, RC and TGT QPs, SRQs, CM ids) the manager
//! names by reference, executes the manager's actions, and feeds it the
//! fabric's CM events, async events and failed completions.

#![warn(missing_docs)]

pub mod conn;
