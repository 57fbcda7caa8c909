//! The wr_id space of a rank's queues, defined once.
//!
//! Every work request the rank posts carries a 64-bit id that its
//! completion returns, and the send CQ and the receive CQ are shared by
//! every QP of the device, so an id alone must say what completed:
//!
//! | bits 63, 62 | meaning | rest |
//! |---|---|---|
//! | `1x` | a receive buffer | class (bits 48..63), chunk (32..48), index (0..32) |
//! | `01` | the connection driver's zero-length hello (iWARP) | zero |
//! | `00` | a posted send, read, write or atomic | its slot in the slab of posted work ([`xrcbtl_progress::WrSlab`], whose ids keep both top bits clear) |

/// Marks a receive buffer's id.
const RECV: u64 = 1 << 63;
/// The id of the connection driver's hello.
pub(crate) const HELLO: u64 = 1 << 62;

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
        } else {
            WrId::Send(id)
        }
    }

    /// The wr_id of posted work with slab id `slab`.
    pub fn send(slab: u64) -> u64 {
        debug_assert_eq!(slab & (RECV | HELLO), 0, "slab ids keep the top bits");
        slab
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
        let mut slab = xrcbtl_progress::WrSlab::new();
        for i in 0..1000 {
            let id = slab.insert(i);
            assert_eq!(WrId::of(WrId::send(id)), WrId::Send(id));
            slab.remove(id);
        }
    }
}
