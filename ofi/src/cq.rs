//! A completion queue's entries and a counter's counts, without libfabric
//! types: the extern "C" layer turns an [`Entry`] into whichever format
//! (CONTEXT, MSG, DATA, TAGGED) the queue was opened with.
//!
//! The rules (fi_cq(3), fi_cntr(3)):
//! - Completions come out in the order they went in, successes and errors
//!   alike. A read returns the successes ahead of the first error; with an
//!   error first, it returns FI_EAVAIL and `fi_cq_readerr` takes the error.
//! - A queue holds at most its size. Room is reserved when work is posted
//!   ([`CompletionQueue::reserve`]), so a completion always has a place: a
//!   post that cannot reserve is refused (FI_EAGAIN) rather than a
//!   completion lost later. A completion nobody reserved for (a further
//!   message into a multi-receive buffer) takes a place only if one is
//!   free ([`CompletionQueue::try_push`]); otherwise nothing is queued and
//!   the caller keeps it.
//! - A counter counts successes and errors apart.
#![forbid(unsafe_code)]

use std::collections::VecDeque;

/// One completion, in the widest format (FI_CQ_FORMAT_TAGGED) plus its
/// source; narrower formats take a prefix of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Entry {
    /// The operation's context (`op_context`).
    pub context: u64,
    /// FI_SEND, FI_RECV, FI_MSG, FI_TAGGED, FI_RMA, FI_MULTI_RECV, ...
    pub flags: u64,
    /// Bytes received (receives only).
    pub len: usize,
    /// Where the data starts (receives into a multi-receive buffer).
    pub buf: u64,
    /// Remote CQ data (with FI_REMOTE_CQ_DATA in `flags`).
    pub data: u64,
    /// The message's tag (tagged receives).
    pub tag: u64,
    /// The sender's address vector number (`fi_cq_readfrom`), or
    /// FI_ADDR_NOTAVAIL.
    pub source: u64,
}

/// A failed operation (`struct fi_cq_err_entry`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrEntry {
    /// The completion's fields as far as they are known.
    pub entry: Entry,
    /// Bytes that did not fit (FI_ETRUNC).
    pub olen: usize,
    /// The error: a positive FI_E* value.
    pub err: i32,
    /// The provider's own code (see [`ProvErr`]).
    pub prov_errno: i32,
}

/// The provider's own error codes, for `prov_errno` and `fi_cq_strerror`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum ProvErr {
    /// No provider detail.
    None = 0,
    /// The peer failed or left (its connection broke, it was removed).
    PeerLost = 1,
    /// The receive was smaller than the message.
    Truncated = 2,
    /// The operation was cancelled.
    Cancelled = 3,
    /// The peer refused the access (key, range or rights).
    RemoteAccess = 4,
    /// The endpoint closed with the operation pending.
    Closed = 5,
    /// A message arrived while the endpoint held as many unexpected bytes
    /// as it may, and was dropped.
    Overrun = 6,
}

impl ProvErr {
    /// The code's meaning, for `fi_cq_strerror`.
    pub fn text(code: i32) -> &'static str {
        Self::text_c(code).to_str().expect("ASCII")
    }

    /// [`ProvErr::text`] with its NUL, for a caller that gives no buffer.
    pub fn text_c(code: i32) -> &'static std::ffi::CStr {
        match code {
            0 => c"no provider detail",
            1 => c"xrc: the peer failed or left before the operation completed",
            2 => c"xrc: the receive buffer was smaller than the message",
            3 => c"xrc: the operation was cancelled",
            4 => c"xrc: the peer refused the access (key, range or rights)",
            5 => c"xrc: the endpoint was closed with the operation pending",
            6 => c"xrc: a message arrived while the endpoint held XRCBTL_OFI_UNEXPECTED_MAX bytes of unexpected messages, and was dropped",
            _ => c"xrc: unknown provider error",
        }
    }
}

/// What a read found.
#[derive(Debug, PartialEq, Eq)]
pub enum Read {
    /// Up to the number asked, all successes.
    Entries(Vec<Entry>),
    /// Nothing (FI_EAGAIN).
    Empty,
    /// An error is next (FI_EAVAIL).
    ErrorFirst,
}

/// A completion queue of at most `size` entries.
pub struct CompletionQueue {
    entries: VecDeque<Result<Entry, ErrEntry>>,
    reserved: usize,
    size: usize,
}

impl CompletionQueue {
    /// Empty, holding at most `size` entries (at least 1).
    pub fn new(size: usize) -> Self {
        CompletionQueue {
            entries: VecDeque::new(),
            reserved: 0,
            size: size.max(1),
        }
    }

    /// Its size.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Entries waiting to be read, errors included.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Places promised to posted work.
    pub fn reserved(&self) -> usize {
        self.reserved
    }

    /// Promises a place to work being posted; false when the queue cannot
    /// promise one (the post is refused with FI_EAGAIN).
    pub fn reserve(&mut self) -> bool {
        if self.entries.len() + self.reserved >= self.size {
            return false;
        }
        self.reserved += 1;
        true
    }

    /// Gives a promised place back (the post failed after reserving, or the
    /// work completes with no entry: FI_SELECTIVE_COMPLETION without
    /// FI_COMPLETION).
    pub fn unreserve(&mut self) {
        assert!(
            self.reserved > 0,
            "a place given back that was never promised"
        );
        self.reserved -= 1;
    }

    /// Posted work completes into its promised place.
    pub fn push(&mut self, completion: Result<Entry, ErrEntry>) {
        self.unreserve();
        self.entries.push_back(completion);
    }

    /// A completion nobody reserved for; false (and nothing queued) when the
    /// queue has no free place.
    pub fn try_push(&mut self, completion: Result<Entry, ErrEntry>) -> bool {
        if self.entries.len() + self.reserved >= self.size {
            return false;
        }
        self.entries.push_back(completion);
        true
    }

    /// `fi_cq_read`: up to `count` successes, stopping before an error.
    pub fn read(&mut self, count: usize) -> Read {
        match self.entries.front() {
            None => return Read::Empty,
            Some(Err(_)) => return Read::ErrorFirst,
            Some(Ok(_)) => {}
        }
        let mut out = Vec::with_capacity(count.min(self.entries.len()));
        while out.len() < count {
            match self.entries.front() {
                Some(Ok(e)) => {
                    out.push(*e);
                    self.entries.pop_front();
                }
                _ => break,
            }
        }
        if out.is_empty() {
            Read::Empty
        } else {
            Read::Entries(out)
        }
    }

    /// `fi_cq_readerr`: the error at the head, if an error is next.
    pub fn read_err(&mut self) -> Option<ErrEntry> {
        match self.entries.front() {
            Some(Err(e)) => {
                let e = *e;
                self.entries.pop_front();
                Some(e)
            }
            _ => None,
        }
    }
}

/// A counter's counts (`fi_cntr_read`, `fi_cntr_readerr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counter {
    /// Operations that succeeded (and what `fi_cntr_add` / `fi_cntr_set`
    /// put there).
    pub ok: u64,
    /// Operations that failed (and `fi_cntr_adderr` / `fi_cntr_seterr`).
    pub err: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(context: u64) -> Result<Entry, ErrEntry> {
        Ok(Entry {
            context,
            ..Entry::default()
        })
    }

    fn err(context: u64) -> Result<Entry, ErrEntry> {
        Err(ErrEntry {
            entry: Entry {
                context,
                ..Entry::default()
            },
            olen: 0,
            err: 5,
            prov_errno: ProvErr::PeerLost as i32,
        })
    }

    fn contexts(r: Read) -> Vec<u64> {
        match r {
            Read::Entries(v) => v.iter().map(|e| e.context).collect(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_read_stops_before_an_error_and_readerr_takes_it_in_order() {
        let mut cq = CompletionQueue::new(8);
        for _ in 0..5 {
            assert!(cq.reserve());
        }
        for c in [ok(1), ok(2), err(3), ok(4), err(5)] {
            cq.push(c);
        }
        assert_eq!(cq.read_err(), None);
        assert_eq!(contexts(cq.read(10)), [1, 2]);
        assert_eq!(cq.read(10), Read::ErrorFirst);
        assert_eq!(cq.read_err().map(|e| e.entry.context), Some(3));
        assert_eq!(cq.read_err(), None);
        assert_eq!(contexts(cq.read(1)), [4]);
        assert_eq!(cq.read(1), Read::ErrorFirst);
        assert_eq!(cq.read_err().map(|e| e.entry.context), Some(5));
        assert_eq!(cq.read(1), Read::Empty);
        assert!(cq.is_empty());
    }

    #[test]
    fn reservations_keep_a_place_for_every_posted_operation() {
        let mut cq = CompletionQueue::new(3);
        assert!(cq.reserve() && cq.reserve());
        // One place left: the unasked completion takes it, then posts wait.
        assert!(cq.try_push(ok(9)));
        assert!(!cq.reserve());
        assert!(!cq.try_push(ok(10)));
        cq.push(ok(1));
        cq.push(ok(2));
        assert_eq!(cq.len(), 3);
        assert!(!cq.reserve());
        assert_eq!(contexts(cq.read(2)), [9, 1]);
        assert!(cq.reserve() && cq.reserve());
        cq.unreserve();
        assert_eq!(cq.reserved(), 1);
    }

    #[test]
    #[should_panic(expected = "never promised")]
    fn a_completion_without_a_reservation_is_a_bug() {
        CompletionQueue::new(4).push(ok(1));
    }

    #[test]
    fn every_provider_code_reads_as_text() {
        for code in 0..6 {
            assert!(!ProvErr::text(code).contains("unknown"));
        }
        assert!(ProvErr::text(99).contains("unknown"));
        assert_eq!(ProvErr::Closed as i32, 5);
    }
}
