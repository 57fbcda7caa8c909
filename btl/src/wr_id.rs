//! The wr_id space of a rank's queues, defined once.
//!
//! Every work request the rank posts carries a 64-bit id that its
//! completion returns, and the send CQ and the receive CQ are shared by
//! every QP of the device, so an id alone must say what completed:
//!
//! | bits 63, 62 | meaning | rest |
//! |---|---|---|
//! | `1x` | a receive buffer | class (bits 48..63), chunk (32..48), index (0..32) |
//! | `01` | the connection driver's zero-length hello (iWARP), when the rest is zero | zero |
//! | `01` | a message in its QP's send log, when bit 61 is set | the log's generation (bits 53..61), the QP's slot (32..53), the message's post number on that QP (0..32) |
//! | `00` | a posted read, write or atomic, or a message on a QP slot past the logs' | its slot in the slab of posted work ([`xrcbtl_progress::WrSlab`], whose ids keep both top bits clear) |

/// Marks a receive buffer's id.
const RECV: u64 = 1 << 63;
/// The id of the connection driver's hello.
pub(crate) const HELLO: u64 = 1 << 62;
/// Marks a logged message's id (never equal to [`HELLO`], whose other bits
/// are clear).
const LOG: u64 = HELLO | 1 << 61;
/// QP slots whose messages can be logged: a slot's number has 21 bits in
/// the id.
pub(crate) const LOG_SLOTS: u32 = 1 << 21;

/// Where a receive buffer lives: its size class, the chunk of the class's
/// buffers, and its index in the chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecvSlot {
    /// Size class (below 2^15).
    pub class: u16,
    /// Chunk of the class.
    pub chunk: u16,
    /// Buffer in the chunk.
    pub index: u32,
}

impl RecvSlot {
    /// The wr_id a receive of this buffer is posted with.
    pub fn wr_id(self) -> u64 {
        debug_assert!(self.class < 1 << 15, "class {} too large", self.class);
        RECV | (u64::from(self.class) << 48) | (u64::from(self.chunk) << 32) | u64::from(self.index)
    }
}

/// What a completion's wr_id names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WrId {
    /// A receive buffer.
    Recv(RecvSlot),
    /// The driver's hello.
    Hello,
    /// Posted work, by its slab id.
    Send(u64),
    /// A message in the send log of QP slot `slot` while its generation was
    /// `gen`: the `no`th request posted on that QP (modulo 2^32).
    Log {
        /// The QP's slot.
        slot: u32,
        /// The log's generation.
        gen: u8,
        /// The low 32 bits of its post number.
        no: u32,
    },
}

impl WrId {
    /// Decodes a completion's wr_id.
    pub fn of(id: u64) -> WrId {
        if id & RECV != 0 {
            WrId::Recv(RecvSlot {
                class: ((id >> 48) & 0x7FFF) as u16,
                chunk: (id >> 32) as u16,
                index: id as u32,
            })
        } else if id == HELLO {
            WrId::Hello
        } else if id & HELLO != 0 {
            WrId::Log {
                slot: (id >> 32) as u32 & (LOG_SLOTS - 1),
                gen: (id >> 53) as u8,
                no: id as u32,
            }
        } else {
            WrId::Send(id)
        }
    }

    /// The wr_id of posted work with slab id `slab`.
    pub fn send(slab: u64) -> u64 {
        debug_assert_eq!(slab & (RECV | HELLO), 0, "slab ids keep the top bits");
        slab
    }

    /// The wr_id of the message posted `no`th on QP slot `slot`, whose log
    /// is in generation `gen`.
    pub fn log(slot: u32, gen: u8, no: u64) -> u64 {
        debug_assert!(slot < LOG_SLOTS, "slot {slot} has no log");
        LOG | (u64::from(gen) << 53) | (u64::from(slot) << 32) | u64::from(no as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_id_decodes_to_itself() {
        for slot in [
            RecvSlot {
                class: 0,
                chunk: 0,
                index: 0,
            },
            RecvSlot {
                class: 0x7FFF,
                chunk: u16::MAX,
                index: u32::MAX,
            },
            RecvSlot {
                class: 3,
                chunk: 7,
                index: 12345,
            },
        ] {
            assert_eq!(WrId::of(slot.wr_id()), WrId::Recv(slot));
        }
        assert_eq!(WrId::of(HELLO), WrId::Hello);
        for (slot, gen, no) in [
            (0, 0, 0),
            (LOG_SLOTS - 1, u8::MAX, u64::from(u32::MAX)),
            (5, 9, 7),
        ] {
            assert_eq!(
                WrId::of(WrId::log(slot, gen, no)),
                WrId::Log {
                    slot,
                    gen,
                    no: no as u32
                }
            );
        }
        // Only the low 32 bits of the post number travel.
        assert_eq!(
            WrId::of(WrId::log(1, 2, (3 << 32) | 4)),
            WrId::Log {
                slot: 1,
                gen: 2,
                no: 4
            }
        );
        let mut slab = xrcbtl_progress::WrSlab::new();
        for i in 0..1000 {
            let id = slab.insert(i);
            assert_eq!(WrId::of(WrId::send(id)), WrId::Send(id));
            slab.remove(id);
        }
    }
}
