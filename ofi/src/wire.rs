//! What the provider puts in front of its messages inside the BTL's active
//! messages: which endpoint of the peer's domain a message is for, its tag
//! and remote CQ data, and the provider's own rendezvous, in which a large
//! message goes straight into the posted buffer: read by the receiver, or
//! (where the receiver's BTL prefers writes: iWARP) written by the sender
//! into the place the receiver offers. Little
//! endian, fixed layout per kind, strictly decoded: a peer's bytes are
//! input, and anything malformed is refused with its reason.
//!
//! Every message starts with the same 8 bytes: version (u8), kind (u8),
//! flags (u16), destination endpoint (u16), source endpoint (u16). Then,
//! by kind:
//!
//! | kind | fields after the common 8 bytes | payload |
//! |---|---|---|
//! | Eager | tag (u64), data (u64), with [`flags::DELIVERY`] also message id (u64) | the message |
//! | Rts | tag, data, message id (u64), length (u64), address (u64), key (u32) | none |
//! | Fin | message id (u64), status (u32) | none |
//! | Cts | message id (u64), grant (u64), length (u64), address (u64), key (u32) | none |
//! | Written | grant (u64), status (u32) | none |
//! | Ack | message id (u64) | none |
//! | WriteData | remote CQ data (u64) | none |
//! | KeyQuery | key (u64) | none |
//! | KeyReply | key (u64), status (u32) | the key's chunks (status 0) |
//!
//! - Eager: a message whole. With [`flags::DELIVERY`] it carries an id, and
//!   the receiver answers with Ack naming it once the message was matched
//!   and copied (FI_DELIVERY_COMPLETE).
//! - Rts: a large message; the sender's buffer is registered at `address`
//!   with `key`. The receiver matches it, reads it into the posted buffer
//!   (as much as fits) and answers Fin with the message id.
//! - Fin: the receiver is done with the sender's buffer; status 0, or a
//!   nonzero code when the read failed (the sender's operation fails).
//! - Cts: instead of reading, the receiver offers the place the message
//!   goes (`length` bytes, at most the message's, at `address` with `key`,
//!   open to remote writes) under its `grant` number.
//! - Written: the sender wrote the granted bytes (status 0), or failed to.
//!   It follows the writes on the same connection, so it arrives after
//!   their data has been placed (InfiniBand's and iWARP's ordering). The
//!   receiver answers Fin.
//! - Ack: an eager message sent with [`flags::DELIVERY`] was delivered.
//! - WriteData: an RMA write with remote CQ data completed at its origin;
//!   the target endpoint reports the data (`fi_writedata`).
//! - KeyQuery: what are the chunks of this compound key of yours
//!   ([`crate::keys`])? For the domain, whichever endpoint it names.
//! - KeyReply: the answer: status 0 and the chunks ([`crate::keys::encode`]),
//!   or a nonzero status and none (no such key).
#![forbid(unsafe_code)]

/// The version this provider speaks.
pub const VERSION: u8 = 2;

/// Bytes every message starts with.
pub const COMMON: usize = 8;

/// The flags of the common header.
pub mod flags {
    /// The message is tagged (FI_TAGGED space), not FI_MSG.
    pub const TAGGED: u16 = 1 << 0;
    /// `data` carries remote CQ data (FI_REMOTE_CQ_DATA).
    pub const DATA: u16 = 1 << 1;
    /// The sender waits for the receiver's Ack (FI_DELIVERY_COMPLETE).
    pub const DELIVERY: u16 = 1 << 2;
    /// Every flag this version knows.
    pub const ALL: u16 = TAGGED | DATA | DELIVERY;
}

/// Kinds, on the wire.
const EAGER: u8 = 1;
const RTS: u8 = 2;
const FIN: u8 = 3;
const ACK: u8 = 4;
const WRITE_DATA: u8 = 5;
const KEY_QUERY: u8 = 6;
const KEY_REPLY: u8 = 7;
const CTS: u8 = 8;
const WRITTEN: u8 = 9;

/// The common header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Common {
    /// [`flags`].
    pub flags: u16,
    /// The receiving endpoint in its domain.
    pub dst_ep: u16,
    /// The sending endpoint in its domain.
    pub src_ep: u16,
}

/// A decoded message header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Msg {
    /// A whole message; the payload follows.
    Eager {
        /// Common fields.
        common: Common,
        /// Tag (0 untagged).
        tag: u64,
        /// Remote CQ data (meaningful with [`flags::DATA`]).
        data: u64,
        /// The sender's id for the Ack, exactly when [`flags::DELIVERY`]
        /// is set.
        ack: Option<u64>,
    },
    /// Request to send a large message.
    Rts {
        /// Common fields.
        common: Common,
        /// Tag (0 untagged).
        tag: u64,
        /// Remote CQ data (meaningful with [`flags::DATA`]).
        data: u64,
        /// The sender's id for it.
        msg_id: u64,
        /// Its length.
        len: u64,
        /// Where the sender's buffer is.
        addr: u64,
        /// The buffer's key.
        key: u32,
    },
    /// The receiver is done with a large message.
    Fin {
        /// Common fields.
        common: Common,
        /// The sender's id.
        msg_id: u64,
        /// 0, or why the receiver's read failed.
        status: u32,
    },
    /// The receiver offers where a large message goes.
    Cts {
        /// Common fields.
        common: Common,
        /// The sender's id of the message.
        msg_id: u64,
        /// The receiver's id of the offer.
        grant: u64,
        /// Bytes to write (at most the message's).
        len: u64,
        /// Where.
        addr: u64,
        /// The place's key.
        key: u32,
    },
    /// The sender wrote what a Cts granted.
    Written {
        /// Common fields.
        common: Common,
        /// The receiver's id of the offer.
        grant: u64,
        /// 0, or why the writes failed.
        status: u32,
    },
    /// An eager message was delivered.
    Ack {
        /// Common fields.
        common: Common,
        /// The sender's id.
        msg_id: u64,
    },
    /// An RMA write with remote CQ data has landed: the target endpoint
    /// reports the data (sent once the write completed at its origin).
    WriteData {
        /// Common fields.
        common: Common,
        /// The remote CQ data.
        data: u64,
    },
    /// The chunks of a compound key, please.
    KeyQuery {
        /// Common fields.
        common: Common,
        /// The key.
        key: u64,
    },
    /// A compound key's chunks (the payload) or its absence.
    KeyReply {
        /// Common fields.
        common: Common,
        /// The key asked about.
        key: u64,
        /// 0 (the chunks follow), or nonzero (no such key, no payload).
        status: u32,
    },
}

impl Msg {
    /// Its common fields.
    pub fn common(&self) -> Common {
        match *self {
            Msg::Eager { common, .. }
            | Msg::Rts { common, .. }
            | Msg::Fin { common, .. }
            | Msg::Cts { common, .. }
            | Msg::Written { common, .. }
            | Msg::Ack { common, .. }
            | Msg::WriteData { common, .. }
            | Msg::KeyQuery { common, .. }
            | Msg::KeyReply { common, .. } => common,
        }
    }

    /// Bytes of the header.
    pub fn len(&self) -> usize {
        COMMON
            + match self {
                Msg::Eager { ack, .. } => 16 + if ack.is_some() { 8 } else { 0 },
                Msg::Rts { .. } => 44,
                Msg::Fin { .. } | Msg::Written { .. } => 12,
                Msg::Cts { .. } => 36,
                Msg::Ack { .. } | Msg::WriteData { .. } | Msg::KeyQuery { .. } => 8,
                Msg::KeyReply { .. } => 12,
            }
    }

    /// Whether the header is empty: never (for clippy's `len` rule).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Appends the header to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let (kind, c) = match self {
            Msg::Eager { common, .. } => (EAGER, common),
            Msg::Rts { common, .. } => (RTS, common),
            Msg::Fin { common, .. } => (FIN, common),
            Msg::Cts { common, .. } => (CTS, common),
            Msg::Written { common, .. } => (WRITTEN, common),
            Msg::Ack { common, .. } => (ACK, common),
            Msg::WriteData { common, .. } => (WRITE_DATA, common),
            Msg::KeyQuery { common, .. } => (KEY_QUERY, common),
            Msg::KeyReply { common, .. } => (KEY_REPLY, common),
        };
        out.push(VERSION);
        out.push(kind);
        out.extend_from_slice(&c.flags.to_le_bytes());
        out.extend_from_slice(&c.dst_ep.to_le_bytes());
        out.extend_from_slice(&c.src_ep.to_le_bytes());
        match *self {
            Msg::Eager {
                common,
                tag,
                data,
                ack,
            } => {
                debug_assert_eq!(
                    ack.is_some(),
                    common.flags & flags::DELIVERY != 0,
                    "an Ack id exactly with DELIVERY"
                );
                out.extend_from_slice(&tag.to_le_bytes());
                out.extend_from_slice(&data.to_le_bytes());
                if let Some(id) = ack {
                    out.extend_from_slice(&id.to_le_bytes());
                }
            }
            Msg::Rts {
                tag,
                data,
                msg_id,
                len,
                addr,
                key,
                ..
            } => {
                for word in [tag, data, msg_id, len, addr] {
                    out.extend_from_slice(&word.to_le_bytes());
                }
                out.extend_from_slice(&key.to_le_bytes());
            }
            Msg::Fin { msg_id, status, .. }
            | Msg::Written {
                grant: msg_id,
                status,
                ..
            } => {
                out.extend_from_slice(&msg_id.to_le_bytes());
                out.extend_from_slice(&status.to_le_bytes());
            }
            Msg::Cts {
                msg_id,
                grant,
                len,
                addr,
                key,
                ..
            } => {
                for word in [msg_id, grant, len, addr] {
                    out.extend_from_slice(&word.to_le_bytes());
                }
                out.extend_from_slice(&key.to_le_bytes());
            }
            Msg::Ack { msg_id, .. } => out.extend_from_slice(&msg_id.to_le_bytes()),
            Msg::WriteData { data, .. } => out.extend_from_slice(&data.to_le_bytes()),
            Msg::KeyQuery { key, .. } => out.extend_from_slice(&key.to_le_bytes()),
            Msg::KeyReply { key, status, .. } => {
                out.extend_from_slice(&key.to_le_bytes());
                out.extend_from_slice(&status.to_le_bytes());
            }
        }
    }

    /// Reads a header from the front of `b`; returns it and the payload
    /// that follows, or why the bytes are refused. Only an Eager message
    /// and a KeyReply with status 0 have a payload.
    pub fn decode(b: &[u8]) -> Result<(Msg, &[u8]), String> {
        let mut r = Reader(b);
        let version = r.u8()?;
        if version != VERSION {
            return Err(format!(
                "provider message version {version}, this provider speaks {VERSION}"
            ));
        }
        let kind = r.u8()?;
        let common = Common {
            flags: r.u16()?,
            dst_ep: r.u16()?,
            src_ep: r.u16()?,
        };
        if common.flags & !flags::ALL != 0 {
            return Err(format!("unknown flags {:#x}", common.flags & !flags::ALL));
        }
        let msg = match kind {
            EAGER => Msg::Eager {
                common,
                tag: r.u64()?,
                data: r.u64()?,
                ack: if common.flags & flags::DELIVERY != 0 {
                    Some(r.u64()?)
                } else {
                    None
                },
            },
            RTS => Msg::Rts {
                common,
                tag: r.u64()?,
                data: r.u64()?,
                msg_id: r.u64()?,
                len: r.u64()?,
                addr: r.u64()?,
                key: r.u32()?,
            },
            FIN => Msg::Fin {
                common,
                msg_id: r.u64()?,
                status: r.u32()?,
            },
            CTS => Msg::Cts {
                common,
                msg_id: r.u64()?,
                grant: r.u64()?,
                len: r.u64()?,
                addr: r.u64()?,
                key: r.u32()?,
            },
            WRITTEN => Msg::Written {
                common,
                grant: r.u64()?,
                status: r.u32()?,
            },
            ACK => Msg::Ack {
                common,
                msg_id: r.u64()?,
            },
            WRITE_DATA => Msg::WriteData {
                common,
                data: r.u64()?,
            },
            KEY_QUERY => Msg::KeyQuery {
                common,
                key: r.u64()?,
            },
            KEY_REPLY => Msg::KeyReply {
                common,
                key: r.u64()?,
                status: r.u32()?,
            },
            k => return Err(format!("unknown message kind {k}")),
        };
        match msg {
            Msg::Eager { .. } => {}
            Msg::Rts { .. } if common.flags & flags::DELIVERY != 0 => {
                return Err("DELIVERY on a large message (its Fin is the delivery)".into());
            }
            Msg::Rts { .. } => {}
            _ if common.flags != 0 => {
                return Err(format!("flags {:#x} on a control message", common.flags))
            }
            _ => {}
        }
        if let Msg::Rts { addr, len, .. } | Msg::Cts { addr, len, .. } = msg {
            if addr.checked_add(len).is_none() {
                return Err(format!(
                    "a large message of {len} bytes at {addr:#x} wraps the address space"
                ));
            }
        }
        let payload = match msg {
            Msg::Eager { .. } => true,
            Msg::KeyReply { status, .. } => status == 0,
            _ => false,
        };
        if !payload && !r.0.is_empty() {
            return Err(format!("{} bytes after a control message", r.0.len()));
        }
        Ok((msg, r.0))
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], String> {
        if self.0.len() < N {
            return Err("provider message cut short".into());
        }
        let (head, rest) = self.0.split_at(N);
        self.0 = rest;
        Ok(head.try_into().expect("N bytes"))
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take::<1>()?[0])
    }

    fn u16(&mut self) -> Result<u16, String> {
        self.take().map(u16::from_le_bytes)
    }

    fn u32(&mut self) -> Result<u32, String> {
        self.take().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, String> {
        self.take().map(u64::from_le_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<Msg> {
        let common = Common {
            flags: flags::TAGGED | flags::DATA,
            dst_ep: 3,
            src_ep: 0xfffe,
        };
        let control = Common { flags: 0, ..common };
        vec![
            Msg::Eager {
                common,
                tag: 0x0102_0304_0506_0708,
                data: u64::MAX,
                ack: None,
            },
            Msg::Eager {
                common: Common {
                    flags: flags::DELIVERY,
                    ..common
                },
                tag: 5,
                data: 0,
                ack: Some(77),
            },
            Msg::Rts {
                common,
                tag: 1,
                data: 2,
                msg_id: 3,
                len: 1 << 33,
                addr: 0x7f00_0000_0000,
                key: 0xdead_beef,
            },
            Msg::Fin {
                common: control,
                msg_id: 9,
                status: 4,
            },
            Msg::Ack {
                common: control,
                msg_id: 10,
            },
            Msg::Cts {
                common: control,
                msg_id: 11,
                grant: 12,
                len: 1 << 20,
                addr: 0x7f00_0010_0000,
                key: 0x1234_5678,
            },
            Msg::Written {
                common: control,
                grant: 12,
                status: 0,
            },
            Msg::WriteData {
                common: control,
                data: 0xfeed,
            },
            Msg::KeyQuery {
                common: control,
                key: crate::keys::COMPOUND | 3,
            },
            Msg::KeyReply {
                common: control,
                key: crate::keys::COMPOUND | 3,
                status: 0,
            },
            Msg::KeyReply {
                common: control,
                key: 4,
                status: 1,
            },
        ]
    }

    #[test]
    fn every_kind_round_trips_with_its_payload_and_has_its_stated_length() {
        for m in samples() {
            let mut b = Vec::new();
            m.encode(&mut b);
            assert_eq!(b.len(), m.len(), "{m:?}");
            let payload: &[u8] = match m {
                Msg::Eager { .. } | Msg::KeyReply { status: 0, .. } => b"hello",
                _ => b"",
            };
            b.extend_from_slice(payload);
            assert_eq!(Msg::decode(&b), Ok((m, payload)));
        }
    }

    #[test]
    fn every_cut_and_every_trailing_byte_of_a_control_message_is_refused() {
        for m in samples() {
            let mut b = Vec::new();
            m.encode(&mut b);
            for cut in 0..b.len() {
                assert!(Msg::decode(&b[..cut]).is_err(), "{m:?} cut at {cut}");
            }
            if !matches!(m, Msg::Eager { .. } | Msg::KeyReply { status: 0, .. }) {
                b.push(0);
                assert!(Msg::decode(&b)
                    .unwrap_err()
                    .contains("after a control message"));
            }
        }
    }

    #[test]
    fn foreign_versions_kinds_flags_and_wrapping_ranges_are_refused_with_a_reason() {
        let mut b = Vec::new();
        let rts = samples()
            .into_iter()
            .find(|m| matches!(m, Msg::Rts { .. }))
            .unwrap();
        rts.encode(&mut b);
        let spoil = |at: usize, v: u8| {
            let mut c = b.clone();
            c[at] = v;
            Msg::decode(&c).unwrap_err()
        };
        assert!(spoil(0, 1).contains("version 1"));
        assert!(spoil(1, 10).contains("kind 10"));
        assert!(spoil(2, 0x80).contains("unknown flags"));
        // An address near the top: address + length wraps.
        let mut near_top = b.clone();
        near_top[COMMON + 8 * 4..COMMON + 8 * 5].copy_from_slice(&(u64::MAX - 10).to_le_bytes());
        assert!(Msg::decode(&near_top).unwrap_err().contains("wraps"));
        // So does a granted place's.
        let mut cts = Vec::new();
        Msg::Cts {
            common: Common {
                flags: 0,
                dst_ep: 0,
                src_ep: 0,
            },
            msg_id: 1,
            grant: 2,
            len: 4096,
            addr: u64::MAX - 100,
            key: 3,
        }
        .encode(&mut cts);
        assert!(Msg::decode(&cts).unwrap_err().contains("wraps"));
        let mut fin = Vec::new();
        Msg::Fin {
            common: Common {
                flags: flags::TAGGED,
                dst_ep: 0,
                src_ep: 0,
            },
            msg_id: 1,
            status: 0,
        }
        .encode(&mut fin);
        assert!(Msg::decode(&fin).unwrap_err().contains("control message"));
    }
}
