//! The private data carried by RDMA CM messages, version 1.
//!
//! Every message has the same 28-byte header; replies that carry SRQ
//! numbers append them. The layout is fixed and little-endian, and carries
//! its own length because the IB CM pads private data to the message's full
//! size. Decoding is strict: a wrong magic, version, length, job or kind is
//! an error with a reason that goes back to the sender in a reject, never a
//! panic.
//!
//! ```text
//! 0  magic "XB"   2  version   3  kind   4  length   5  flags   6  reason   7  srq count
//! 8  job id (u32)   12 source rank   16 destination rank   20 tag   24 TGT QP number
//! 28 SRQ numbers (u32 each)
//! ```

/// First two bytes of every message.
pub const MAGIC: [u8; 2] = *b"XB";
/// The version this crate speaks.
pub const VERSION: u8 = 1;
/// Header length.
pub const HEADER_LEN: usize = 28;
/// Most SRQ numbers a message carries (size classes).
pub const MAX_SRQS: usize = 8;

/// What a message asks or answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Request with a QP: connect my INI (or RC) QP to you.
    Connect = 1,
    /// Request without a QP: register with the TGT QP `tgt` my INI QP
    /// already reaches on your node.
    Reuse = 2,
    /// Request without a QP: I am leaving (or: TGT QP `tgt` is dead).
    Leave = 3,
    /// Reply to Connect: accepted; here are the TGT QP and my SRQs.
    Accept = 4,
    /// Reply to Reuse (in a reject): registered; here are my SRQs.
    ReuseOk = 5,
    /// Reply to Leave (in a reject): noted.
    LeaveAck = 6,
    /// Reply to anything (in a reject): refused, see the reason.
    Refuse = 7,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Connect,
            2 => Kind::Reuse,
            3 => Kind::Leave,
            4 => Kind::Accept,
            5 => Kind::ReuseOk,
            6 => Kind::LeaveAck,
            7 => Kind::Refuse,
            _ => return None,
        })
    }
}

/// Why a request was refused (carried in `Refuse`, and counted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// The message was not ours (magic) or not decodable.
    Malformed = 1,
    /// Another protocol version.
    BadVersion = 2,
    /// The length field disagrees with the bytes or the kind.
    BadLength = 3,
    /// Another job's rank.
    WrongJob = 4,
    /// A kind that is not a request, or unknown.
    BadKind = 5,
    /// The request is for another rank than the one listening.
    WrongRank = 6,
    /// The TGT QP to reuse is gone: rebuild the INI QP and connect afresh.
    NotReady = 7,
    /// Both sides connected at once; the other connection wins.
    Collision = 8,
    /// The rank is shutting down.
    Leaving = 9,
    /// Resources ran out (QP table, TGT creation).
    NoResource = 10,
}

impl Reason {
    fn from_u8(v: u8) -> Option<Reason> {
        Some(match v {
            1 => Reason::Malformed,
            2 => Reason::BadVersion,
            3 => Reason::BadLength,
            4 => Reason::WrongJob,
            5 => Reason::BadKind,
            6 => Reason::WrongRank,
            7 => Reason::NotReady,
            8 => Reason::Collision,
            9 => Reason::Leaving,
            10 => Reason::NoResource,
            _ => return None,
        })
    }
}

/// Flag: the responder should treat the connection as its own endpoint to
/// the initiator too (RC mode: one QP carries both directions).
pub const FLAG_RECIPROCAL: u8 = 1;

/// A decoded message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Msg {
    /// What it is.
    pub kind: Kind,
    /// Flags (`FLAG_*`).
    pub flags: u8,
    /// Refusal reason (`Refuse` only).
    pub reason: Option<Reason>,
    /// Job id.
    pub job: u32,
    /// Sending rank.
    pub src: u32,
    /// Intended rank.
    pub dst: u32,
    /// The initiator's connection tag, echoed in replies.
    pub tag: u32,
    /// XRC TGT QP number (Reuse, Leave, Accept), else 0.
    pub tgt: u32,
    /// SRQ numbers by size class (Accept, ReuseOk).
    pub srqns: Vec<u32>,
}

impl Msg {
    /// A message with an empty body.
    pub fn new(kind: Kind, job: u32, src: u32, dst: u32, tag: u32) -> Msg {
        Msg {
            kind,
            flags: 0,
            reason: None,
            job,
            src,
            dst,
            tag,
            tgt: 0,
            srqns: Vec::new(),
        }
    }

    /// Encoded length.
    pub fn len(&self) -> usize {
        HEADER_LEN + 4 * self.srqns.len()
    }

    /// Whether the message is empty (never).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Encodes the message.
    pub fn encode(&self) -> Vec<u8> {
        assert!(self.srqns.len() <= MAX_SRQS, "too many SRQ classes");
        let mut b = Vec::with_capacity(self.len());
        b.extend_from_slice(&MAGIC);
        b.push(VERSION);
        b.push(self.kind as u8);
        b.push(self.len() as u8);
        b.push(self.flags);
        b.push(self.reason.map_or(0, |r| r as u8));
        b.push(self.srqns.len() as u8);
        for v in [self.job, self.src, self.dst, self.tag, self.tgt] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for s in &self.srqns {
            b.extend_from_slice(&s.to_le_bytes());
        }
        b
    }

    /// Decodes a message received from `job`. Trailing bytes beyond the
    /// length field are padding (the IB CM pads private data) and ignored.
    pub fn decode(bytes: &[u8], job: u32) -> Result<Msg, Reason> {
        if bytes.len() < 4 || bytes[0..2] != MAGIC {
            return Err(Reason::Malformed);
        }
        if bytes[2] != VERSION {
            return Err(Reason::BadVersion);
        }
        if bytes.len() < HEADER_LEN {
            return Err(Reason::BadLength);
        }
        let kind = Kind::from_u8(bytes[3]).ok_or(Reason::BadKind)?;
        let len = usize::from(bytes[4]);
        let nsrq = usize::from(bytes[7]);
        if nsrq > MAX_SRQS || len != HEADER_LEN + 4 * nsrq || len > bytes.len() {
            return Err(Reason::BadLength);
        }
        let word = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
        let reason = match (kind, bytes[6]) {
            (Kind::Refuse, r) => Some(Reason::from_u8(r).ok_or(Reason::Malformed)?),
            (_, 0) => None,
            _ => return Err(Reason::Malformed),
        };
        let carries_srqs = matches!(kind, Kind::Accept | Kind::ReuseOk);
        if !carries_srqs && nsrq > 0 {
            return Err(Reason::BadLength);
        }
        let msg = Msg {
            kind,
            flags: bytes[5],
            reason,
            job: word(8),
            src: word(12),
            dst: word(16),
            tag: word(20),
            tgt: word(24),
            srqns: (0..nsrq).map(|i| word(HEADER_LEN + 4 * i)).collect(),
        };
        if msg.job != job {
            return Err(Reason::WrongJob);
        }
        Ok(msg)
    }

    /// Whether the kind is a request a listener answers.
    pub fn is_request(&self) -> bool {
        matches!(self.kind, Kind::Connect | Kind::Reuse | Kind::Leave)
    }
}

/// The best-effort identity of a malformed request, to address the refusal
/// (the tag echoes back if the header is readable).
pub fn peek_tag(bytes: &[u8]) -> u32 {
    if bytes.len() >= HEADER_LEN && bytes[0..2] == MAGIC {
        u32::from_le_bytes(bytes[20..24].try_into().expect("4 bytes"))
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept() -> Msg {
        Msg {
            tgt: 0xabcdef,
            srqns: vec![11, 22, 33],
            flags: FLAG_RECIPROCAL,
            ..Msg::new(Kind::Accept, 7, 1, 2, 99)
        }
    }

    #[test]
    fn round_trip_and_padding() {
        let m = accept();
        let mut b = m.encode();
        assert_eq!(b.len(), 40);
        assert_eq!(Msg::decode(&b, 7), Ok(m.clone()));
        // The IB CM pads private data: trailing zeros are not part of it.
        b.resize(196, 0);
        assert_eq!(Msg::decode(&b, 7), Ok(m));
        let refuse = Msg {
            reason: Some(Reason::NotReady),
            ..Msg::new(Kind::Refuse, 7, 2, 1, 5)
        };
        assert_eq!(Msg::decode(&refuse.encode(), 7), Ok(refuse));
    }

    #[test]
    fn requests_fit_the_smallest_limit() {
        // 56 bytes: an IB CM REQ in the TCP port space.
        assert!(Msg::new(Kind::Connect, 1, 2, 3, 4).encode().len() <= 56);
        let mut r = Msg::new(Kind::Reuse, 1, 2, 3, 4);
        r.tgt = 5;
        assert!(r.encode().len() <= 56);
        // A reply with every class fits a REJ (148) and a REP (196).
        let mut a = accept();
        a.srqns = vec![1; MAX_SRQS];
        assert!(a.encode().len() <= 148);
    }

    #[test]
    fn malformed_input_is_refused_with_a_reason() {
        let good = accept().encode();
        assert_eq!(Msg::decode(&[], 7), Err(Reason::Malformed));
        assert_eq!(
            Msg::decode(b"nope, not ours at all, sorry!!", 7),
            Err(Reason::Malformed)
        );
        let mut v = good.clone();
        v[2] = 2;
        assert_eq!(Msg::decode(&v, 7), Err(Reason::BadVersion));
        assert_eq!(Msg::decode(&good[..20], 7), Err(Reason::BadLength));
        let mut v = good.clone();
        v[4] = 200;
        assert_eq!(Msg::decode(&v, 7), Err(Reason::BadLength));
        let mut v = good.clone();
        v[7] = 2; // two SRQs claimed, length says three
        assert_eq!(Msg::decode(&v, 7), Err(Reason::BadLength));
        let mut v = good.clone();
        v[3] = 42;
        assert_eq!(Msg::decode(&v, 7), Err(Reason::BadKind));
        assert_eq!(Msg::decode(&good, 8), Err(Reason::WrongJob));
        let mut v = good.clone();
        v[6] = 3; // a reason on a non-refusal
        assert_eq!(Msg::decode(&v, 7), Err(Reason::Malformed));
        // Every truncation and every single-byte corruption decodes or is
        // refused: never a panic.
        for cut in 0..good.len() {
            let _ = Msg::decode(&good[..cut], 7);
        }
        for i in 0..good.len() {
            for x in [0u8, 1, 0x7f, 0xff] {
                let mut v = good.clone();
                v[i] = x;
                let _ = Msg::decode(&v, 7);
            }
        }
    }
}
