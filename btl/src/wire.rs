//! What the BTL puts on the wire in front of every message, and the payloads
//! of its rendezvous control messages. Little-endian, fixed layout, checked
//! strictly on receipt.
//!
//! Header (16 bytes): source rank (u32), sequence number (u32, one sequence
//! per source and destination, shared by every kind but [`Kind::Credit`]),
//! kind (u8), tag (u8), credits returned (u16; zero unless the connection
//! runs credit flow control), payload length (u32).

/// Bytes of the header.
pub const HEADER: usize = 16;

/// The longest body kept in a message itself: by a message posted inline
/// (`work.rs`'s `Store::Small`), and by a message received and copied out
/// of its receive buffer (`delivery.rs`'s `Short`). 64 bytes keep a
/// posted request (`post.rs`'s `PostedWr`) within 128 bytes, which the
/// compiler moves with a few vector stores. At 112 bytes every move of a
/// message (into the queue, the slab, back out) called `memcpy`: about
/// 200 instructions per 8-byte message (callgrind, siw).
pub(crate) const SMALL_BODY: usize = 64;

/// What a message is; its code on the wire is its discriminant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// An eager active message: the payload is the user's data.
    Eager = 1,
    /// Request to send (rendezvous): [`Rts`].
    Rts = 2,
    /// Ready to receive (put rendezvous): [`Rtr`].
    Rtr = 3,
    /// Acknowledge to send: the receiver has read everything (get).
    Ats = 4,
    /// Finished: the sender has written everything (put).
    Fin = 5,
    /// Only returns credits (header only, outside the sequence).
    Credit = 6,
    /// A part of a message split across several eager messages: more
    /// parts follow, and the last one is an [`Kind::Eager`]. The parts of
    /// one message take consecutive sequence numbers, so the receiver
    /// joins them in arrival order.
    Part = 7,
    /// The receiver refuses a rendezvous (longer than it accepts, or no
    /// memory for it): the sender's operation fails.
    Nak = 8,
}

impl Kind {
    fn code(self) -> u8 {
        self as u8
    }

    fn from_code(c: u8) -> Option<Kind> {
        Some(match c {
            1 => Kind::Eager,
            2 => Kind::Rts,
            3 => Kind::Rtr,
            4 => Kind::Ats,
            5 => Kind::Fin,
            6 => Kind::Credit,
            7 => Kind::Part,
            8 => Kind::Nak,
            _ => return None,
        })
    }
}

/// A decoded header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Sending rank.
    pub src: u32,
    /// Sequence number from `src` to this rank.
    pub seq: u32,
    /// Kind.
    pub kind: Kind,
    /// Active-message tag (eager and RTS).
    pub tag: u8,
    /// Receives the sender has reposted for this destination since it last
    /// said so (credit flow control).
    pub credits: u16,
    /// Payload bytes after the header.
    pub len: u32,
}

impl Header {
    /// Writes the header into `out[..HEADER]`.
    pub fn encode(&self, out: &mut [u8]) {
        // One bounds check for the whole header.
        let out: &mut [u8; HEADER] = out.first_chunk_mut().expect("room for a header");
        out[0..4].copy_from_slice(&self.src.to_le_bytes());
        out[4..8].copy_from_slice(&self.seq.to_le_bytes());
        out[8] = self.kind.code();
        out[9] = self.tag;
        out[10..12].copy_from_slice(&self.credits.to_le_bytes());
        out[12..16].copy_from_slice(&self.len.to_le_bytes());
    }

    /// Reads a header from a received message of `msg.len()` bytes; `None`
    /// when it is short, of an unknown kind, or its length disagrees.
    pub fn decode(msg: &[u8]) -> Option<Header> {
        let (b, body) = msg.split_first_chunk::<HEADER>()?;
        let h = Header::fields(b, Kind::from_code(b[8])?);
        let credit_only = h.kind != Kind::Credit || (h.len == 0 && h.tag == 0);
        (h.len as usize == body.len() && credit_only).then_some(h)
    }

    /// [`Header::decode`] of an eager message: `None` for any other kind
    /// too, told by one test of its code.
    #[inline(always)]
    pub fn decode_eager(msg: &[u8]) -> Option<Header> {
        let (b, body) = msg.split_first_chunk::<HEADER>()?;
        Header::eager_of(b, body.len())
    }

    /// The header `b` of an eager message of `body_len` bytes of body:
    /// `None` for any other kind, or when its length disagrees.
    #[inline(always)]
    pub fn eager_of(b: &[u8; HEADER], body_len: usize) -> Option<Header> {
        if b[8] != Kind::Eager.code() {
            return None;
        }
        let h = Header::fields(b, Kind::Eager);
        (h.len as usize == body_len).then_some(h)
    }

    /// The fields of header `b`, of kind `kind` (read from `b[8]`). A
    /// header of fixed size: they are read with no bounds checks.
    #[inline(always)]
    fn fields(b: &[u8; HEADER], kind: Kind) -> Header {
        let u = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        Header {
            src: u(0),
            seq: u(4),
            kind,
            tag: b[9],
            credits: u16::from_le_bytes([b[10], b[11]]),
            len: u(12),
        }
    }
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"))
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"))
}

/// Request to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rts {
    /// The sender's id of the message.
    pub msg: u64,
    /// Bytes to move.
    pub len: u64,
    /// Where the data is (get) or 0 (put).
    pub addr: u64,
    /// Its rkey (get) or 0 (put).
    pub rkey: u32,
    /// The protocol the sender chose.
    pub put: bool,
}

impl Rts {
    /// Encoded length.
    pub const LEN: usize = 29;

    /// Encodes.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..8].copy_from_slice(&self.msg.to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..24].copy_from_slice(&self.addr.to_le_bytes());
        b[24..28].copy_from_slice(&self.rkey.to_le_bytes());
        b[28] = u8::from(self.put);
        b
    }

    /// Decodes; `None` unless exactly [`Rts::LEN`] well-formed bytes.
    pub fn decode(b: &[u8]) -> Option<Rts> {
        if b.len() != Self::LEN || b[28] > 1 {
            return None;
        }
        Some(Rts {
            msg: u64_at(b, 0),
            len: u64_at(b, 8),
            addr: u64_at(b, 16),
            rkey: u32_at(b, 24),
            put: b[28] == 1,
        })
    }
}

/// Ready to receive: where the sender may write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rtr {
    /// The sender's id of the message.
    pub msg: u64,
    /// Where to write.
    pub addr: u64,
    /// The sink's rkey.
    pub rkey: u32,
}

impl Rtr {
    /// Encoded length.
    pub const LEN: usize = 20;

    /// Encodes.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..8].copy_from_slice(&self.msg.to_le_bytes());
        b[8..16].copy_from_slice(&self.addr.to_le_bytes());
        b[16..20].copy_from_slice(&self.rkey.to_le_bytes());
        b
    }

    /// Decodes; `None` unless exactly [`Rtr::LEN`] bytes.
    pub fn decode(b: &[u8]) -> Option<Rtr> {
        (b.len() == Self::LEN).then(|| Rtr {
            msg: u64_at(b, 0),
            addr: u64_at(b, 8),
            rkey: u32_at(b, 16),
        })
    }
}

/// The message id carried by ATS and FIN.
pub fn encode_msg_id(msg: u64) -> [u8; 8] {
    msg.to_le_bytes()
}

/// Decodes an ATS or FIN payload.
pub fn decode_msg_id(b: &[u8]) -> Option<u64> {
    (b.len() == 8).then(|| u64_at(b, 0))
}

/// The longest control payload ([`Rts::LEN`]).
pub const CONTROL_MAX: usize = Rts::LEN;

/// Copies `src` into `dst`, of the same length: up to 64 bytes (a
/// [`SMALL_BODY`]) in two fixed-size moves that overlap as needed,
/// without a call into `memcpy` (which costs more than the copy for a few
/// bytes); longer, as `copy_from_slice` does.
#[inline(always)]
pub(crate) fn copy_short(dst: &mut [u8], src: &[u8]) {
    let n = src.len();
    debug_assert_eq!(dst.len(), n);
    // Each arm copies a head and a tail of one fixed size that together
    // cover all `n` bytes. Inline, as the whole: a call for two moves
    // costs more than they do.
    #[inline(always)]
    fn two<const K: usize>(dst: &mut [u8], src: &[u8]) {
        let n = src.len();
        dst[..K].copy_from_slice(&src[..K]);
        dst[n - K..].copy_from_slice(&src[n - K..]);
    }
    match n {
        0..=3 => {
            for (d, s) in dst.iter_mut().zip(src) {
                *d = *s;
            }
        }
        4..=7 => two::<4>(dst, src),
        8..=15 => two::<8>(dst, src),
        16..=31 => two::<16>(dst, src),
        32..=64 => two::<32>(dst, src),
        _ => dst.copy_from_slice(src),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every length a short body may have, at every offset of a larger
    /// buffer: the bytes land where they belong, and only there.
    #[test]
    fn copy_short_copies_every_length_exactly() {
        let src: Vec<u8> = (1..=SMALL_BODY as u8 + 8).collect();
        for n in 0..=SMALL_BODY + 8 {
            for at in [0, 1, 7] {
                let mut out = [0u8; 2 * SMALL_BODY + 16];
                copy_short(&mut out[at..at + n], &src[..n]);
                assert_eq!(&out[at..at + n], &src[..n], "{n} bytes at {at}");
                assert!(out[..at].iter().chain(&out[at + n..]).all(|&b| b == 0));
            }
        }
    }

    #[test]
    fn headers_and_control_payloads_round_trip_and_reject_garbage() {
        let h = Header {
            src: 7,
            seq: u32::MAX,
            kind: Kind::Rts,
            tag: 9,
            credits: 513,
            len: 3,
        };
        let mut m = vec![0u8; HEADER + 3];
        h.encode(&mut m);
        assert_eq!(Header::decode(&m), Some(h));
        assert_eq!(Header::decode(&m[..HEADER + 2]), None, "length disagrees");
        assert_eq!(Header::decode(&m[..10]), None, "short");
        m[8] = 99;
        assert_eq!(Header::decode(&m), None, "unknown kind");
        m[8] = 2;
        assert_eq!(Header::decode(&m), Some(h));
        assert_eq!(Header::decode_eager(&m), None, "an RTS is not eager");
        m[8] = Kind::Eager.code();
        let e = Header {
            kind: Kind::Eager,
            ..h
        };
        assert_eq!(Header::decode_eager(&m), Some(e));
        assert_eq!(
            Header::decode(&m),
            Some(e),
            "both read an eager header alike"
        );
        assert_eq!(
            Header::decode_eager(&m[..HEADER + 2]),
            None,
            "length disagrees"
        );
        assert_eq!(Header::decode_eager(&m[..10]), None, "short");
        let c = Header {
            kind: Kind::Credit,
            tag: 0,
            len: 0,
            ..h
        };
        let mut m = vec![0u8; HEADER];
        c.encode(&mut m);
        assert_eq!(Header::decode(&m), Some(c));
        m[9] = 1;
        assert_eq!(Header::decode(&m), None, "a credit message has no tag");
        let mut m = vec![0u8; HEADER + 1];
        Header { len: 1, ..c }.encode(&mut m);
        assert_eq!(Header::decode(&m), None, "nor a payload");

        let r = Rts {
            msg: 1 << 40,
            len: 5 << 20,
            addr: 0xdead_beef_0000,
            rkey: 0x1234,
            put: true,
        };
        assert_eq!(Rts::decode(&r.encode()), Some(r));
        assert_eq!(Rts::decode(&r.encode()[1..]), None);
        let mut bad = r.encode();
        bad[28] = 2;
        assert_eq!(Rts::decode(&bad), None);
        let t = Rtr {
            msg: 3,
            addr: 4,
            rkey: 5,
        };
        assert_eq!(Rtr::decode(&t.encode()), Some(t));
        assert_eq!(Rtr::decode(&[0; 19]), None);
        assert_eq!(decode_msg_id(&encode_msg_id(77)), Some(77));
        assert_eq!(decode_msg_id(&[0; 9]), None);
    }
}
