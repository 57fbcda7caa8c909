//! Work for a peer, as it waits in an endpoint's queue and, once posted,
//! in its QP's send log or the slab of posted work: messages (eager, rendezvous control, credit-only) with
//! wherever their body is kept, and RDMA operations.

use bytes::Bytes;
use xrcbtl_fabric::{Context, Registration};

use crate::iface::Slots;
use crate::proto::Rdma;
use crate::types::Tag;
use crate::wire::{copy_short, Kind, HEADER, SMALL_BODY};

/// Where a message's body is kept until its completion: a bounce slot, or
/// (when none was free) a heap copy that takes a slot when it is posted,
/// or the sender's own registered memory.
#[derive(Debug)]
pub(crate) enum Store {
    /// A bounce slot: the body sits after the header's room.
    Slot(u32),
    /// The body itself (empty for header-only messages).
    Heap(Vec<u8>),
    /// A short body kept in the message itself: it goes inline, with no
    /// bounce slot to take, fill, read back and give back.
    Small {
        /// Bytes used.
        len: u8,
        /// The body.
        bytes: [u8; SMALL_BODY],
    },
    /// The body in the sender's shared buffer, registered through the
    /// cache and sent from where it is (zero copy); the header goes from a
    /// bounce slot, taken when the message is posted.
    User {
        /// The header's slot, once posted.
        slot: Option<u32>,
        /// The body, kept until the message completes.
        data: Bytes,
        /// Its registration.
        reg: Registration,
    },
}

/// `parts` gathered into the body of a [`Store::Small`], if they fit
/// (an empty part costs no copy).
#[inline]
pub(crate) fn small_body(parts: [&[u8]; 2]) -> Option<[u8; SMALL_BODY]> {
    if parts[0].len() + parts[1].len() > SMALL_BODY {
        return None;
    }
    let mut bytes = [0u8; SMALL_BODY];
    let (head, tail) = bytes.split_at_mut(parts[0].len());
    copy_short(head, parts[0]);
    copy_short(&mut tail[..parts[1].len()], parts[1]);
    Some(bytes)
}

impl Store {
    /// A short body copied from `parts`, if it fits.
    pub fn small(parts: [&[u8]; 2]) -> Option<Store> {
        Some(Store::Small {
            bytes: small_body(parts)?,
            len: (parts[0].len() + parts[1].len()) as u8,
        })
    }

    /// The body, where the store holds it in memory (not in a slot).
    pub fn bytes(&self) -> Option<&[u8]> {
        match self {
            Store::Slot(_) => None,
            Store::Heap(b) => Some(b),
            Store::Small { len, bytes } => Some(&bytes[..usize::from(*len)]),
            Store::User { data, .. } => Some(data),
        }
    }
}

/// A message: eager, rendezvous control, or credit-only.
#[derive(Debug)]
pub(crate) struct Msg {
    /// Sequence number (0 for credit-only messages, which are outside the
    /// sequence).
    pub seq: u32,
    /// What it is.
    pub kind: Kind,
    /// Its tag.
    pub tag: Tag,
    /// Bytes of body after the header.
    pub len: u32,
    /// Where the body is.
    pub store: Store,
}

/// Work for one peer.
#[derive(Debug)]
pub(crate) enum Work {
    /// A message.
    Msg(Msg),
    /// An RDMA read, write or atomic.
    Rdma(Rdma),
}

/// Queued work and its place in the endpoint's order.
#[derive(Debug)]
pub(crate) struct Item {
    /// Position in the endpoint's order (0: ahead of everything, for
    /// credit-only messages).
    pub order: u64,
    /// Failed attempts so far.
    pub tries: u32,
    /// The work.
    pub work: Work,
}

/// The tag of a credit-only message that covers unsignalled work: it goes
/// (signalled) even with no credits to return.
const COVER: Tag = 1;

impl Msg {
    /// Whether this is a cover: a credit-only message that goes even with
    /// no credits to return.
    pub fn is_cover(&self) -> bool {
        self.kind == Kind::Credit && self.tag == COVER
    }
}

impl Item {
    /// Whether this is a credit-only message.
    pub fn is_credit(&self) -> bool {
        matches!(&self.work, Work::Msg(m) if m.kind == Kind::Credit)
    }

    fn credit_msg(tag: Tag) -> Item {
        Item {
            order: 0,
            tries: 0,
            work: Work::Msg(Msg {
                seq: 0,
                kind: Kind::Credit,
                tag,
                len: 0,
                store: Store::Heap(Vec::new()),
            }),
        }
    }

    /// A credit-only message, to queue ahead of everything.
    pub fn credit() -> Item {
        Item::credit_msg(0)
    }

    /// A credit-only message that goes signalled even with nothing to
    /// return (a cover).
    pub fn cover() -> Item {
        Item::credit_msg(COVER)
    }
}

/// Takes the bounce slot of the last queued message in `pending` that
/// holds one, moving its body to the heap.
pub(crate) fn steal_slot<C: Context>(
    pending: &mut std::collections::VecDeque<Item>,
    bounce: &Slots<C>,
) -> Option<u32> {
    for item in pending.iter_mut().rev() {
        if let Work::Msg(m) = &mut item.work {
            if let Store::Slot(s) = m.store {
                let mut body = vec![0u8; m.len as usize];
                bounce.read_to(s, HEADER, &mut body);
                m.store = Store::Heap(body);
                return Some(s);
            }
        }
    }
    None
}

impl Store {
    /// Copies the first `out.len()` bytes of the body into `out`, from
    /// wherever it is kept (a slot of `slots`, or memory).
    pub fn copy_to<C: Context>(&self, slots: &Slots<C>, out: &mut [u8]) {
        match (self, self.bytes()) {
            (_, Some(body)) => out.copy_from_slice(&body[..out.len()]),
            (Store::Slot(s), None) => slots.read_to(*s, HEADER, out),
            (_, None) => {}
        }
    }
}
