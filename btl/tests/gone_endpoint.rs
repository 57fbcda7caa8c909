//! A message from a peer whose endpoint failed here is not delivered,
//! even when it arrives on the QP that carried that peer's last message,
//! next in its sequence: the receive side's straight line
//! (`Recv::short_eager`) must turn it away as the general path does, and
//! the peer is told that this rank gave it up (`ConnManager::disown`).

mod btlsim;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use btlsim::{Cluster, TAG};
use xrcbtl_btl::{BtlError, Notice, Peer};
use xrcbtl_fabric::sim::{CmAction, CmFault, CmMsgKind, SimDevice};

const LIMIT: Duration = Duration::from_secs(120);

/// Ranks 0 and 1 on node 0, 2 and 3 on node 1 (XRC). Rank 0's endpoint
/// to rank 3 fails (its requests to node 1 are lost) while rank 3's own
/// connection to node 0, and the QP generation rank 0 last saw rank 3's
/// messages at, stay as they were; rank 3's next message is dropped.
#[test]
fn a_message_for_a_failed_endpoint_is_not_delivered_on_the_straight_line() {
    let mut c = Cluster::new(61, 2, 2, SimDevice::ib("sim0"));
    // Rank 0 reaches node 1 through rank 2: its INI QP there is up, and
    // an endpoint to rank 3 would ride on it without a QP of its own.
    c.btl(0).send(2, TAG, &[], b"to two").unwrap();
    c.run_until(LIMIT, |c| c.got_count(2) == 1);
    // Rank 3's messages reach rank 0 on its own INI QP, node 0's TGT QP:
    // the last one read there sets what the straight line expects.
    for (i, body) in [b"one", b"two"].iter().enumerate() {
        c.btl(3).send(0, TAG, &[], *body).unwrap();
        c.run_until(LIMIT, |c| c.got_count(0) == i + 1);
    }
    let before = c.btl(0).stats();
    let errors = Arc::new(Mutex::new(Vec::new()));
    let e = errors.clone();
    c.btl(0)
        .register_error(move |_, r, err| e.lock().unwrap().push((r, err.clone())));
    // Rank 0's requests to node 1 are lost until its endpoint to rank 3
    // fails for good.
    c.sim
        .add_cm_fault(CmFault::new(Some(CmMsgKind::Req), CmAction::Drop).between(0, 1));
    c.btl(0).send(3, TAG, &[], b"never").unwrap();
    c.run_until(LIMIT, |_| !errors.lock().unwrap().is_empty());
    let got = errors.lock().unwrap().clone();
    assert!(
        matches!(got[..], [(3, BtlError::Unreachable(3, _))]),
        "{got:?}"
    );
    c.sim.clear_cm_faults();
    // Rank 3 has heard nothing of it and sends again, next in its
    // sequence, on the QP rank 0 saw it on last.
    c.btl(3).send(0, TAG, &[], b"late").unwrap();
    // It is told, as by a rank that leaves: its endpoint to rank 0 closes,
    // and sends to it fail.
    c.run_until(LIMIT, |c| {
        c.notices(3).contains(&Notice::Closed { rank: 0 })
    });
    c.settle(LIMIT);
    assert!(
        c.btl(3).send(0, TAG, &[], b"after").is_err(),
        "rank 3 was not told"
    );
    let bodies: Vec<Vec<u8>> = c.got(0).into_iter().map(|g| g.data).collect();
    assert_eq!(
        bodies,
        [b"one".to_vec(), b"two".to_vec()],
        "a message for a failed endpoint was delivered"
    );
    let after = c.btl(0).stats();
    assert_eq!(after.eager_received, before.eager_received);
}

/// Ranks 0 and 1 on nodes 0 and 1 (XRC). The straight line reads the
/// sender's endpoint at the index it last believed it at
/// (`Recv::sender_seen`), without looking the rank up. Rank 0 deletes its
/// endpoint to rank 1 (the index stays, gone) and adds a new one (at a
/// new index); rank 1 has heard nothing and goes on with its sequence, on
/// the same QP. Nothing of it is delivered, neither through the gone
/// endpoint nor out of the new one's sequence, while rank 0's own
/// messages reach rank 1 on the new endpoint.
#[test]
fn a_deleted_endpoint_is_not_read_again_by_the_straight_line() {
    let mut c = Cluster::new(62, 2, 1, SimDevice::ib("sim0"));
    for (i, body) in [b"one", b"two"].iter().enumerate() {
        c.btl(1).send(0, TAG, &[], *body).unwrap();
        c.run_until(LIMIT, |c| c.got_count(0) == i + 1);
    }
    c.btl(0).del_procs(&[1]);
    c.settle(LIMIT);
    c.btl(1).send(0, TAG, &[], b"after the delete").unwrap();
    c.settle(LIMIT);
    let b1 = c.btl(1);
    let again = Peer {
        rank: 1,
        node: 1,
        addr: b1.listen_addr().unwrap(),
        ib: None,
        receive: Some(b1.receive()),
    };
    c.btl(0).add_procs(&[again]).unwrap();
    c.btl(1).send(0, TAG, &[], b"after the new one").unwrap();
    c.btl(0).send(1, TAG, &[], b"from the new one").unwrap();
    c.run_until(LIMIT, |c| c.got_count(1) == 1);
    c.settle(LIMIT);
    assert_eq!(c.got(1)[0].data, b"from the new one");
    let bodies: Vec<Vec<u8>> = c.got(0).into_iter().map(|g| g.data).collect();
    assert_eq!(
        bodies,
        [b"one".to_vec(), b"two".to_vec()],
        "a message was delivered through a deleted endpoint"
    );
    let s = c.btl(0).stats();
    assert_eq!(s.eager_received, 2, "{s:?}");
}
