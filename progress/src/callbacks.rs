//! The callback queue.

use std::fmt;

/// Whether a callback stays on the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// Call again at the next progress; it did this much work.
    Yes(usize),
    /// Nothing outstanding any more: take it off the queue (it did this much
    /// work on the way out).
    No(usize),
}

/// Names a registered callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CallbackId(u64);

type Cb<S> = Box<dyn FnMut(&mut S) -> Keep + Send>;

/// Callbacks run in registration order at every progress call, each given
/// the shared state `S`.
pub struct Callbacks<S> {
    entries: Vec<(CallbackId, Cb<S>)>,
    next: u64,
}

impl<S> Default for Callbacks<S> {
    fn default() -> Self {
        Callbacks {
            entries: Vec::new(),
            next: 0,
        }
    }
}

impl<S> fmt::Debug for Callbacks<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Callbacks({})", self.entries.len())
    }
}

impl<S> Callbacks<S> {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a callback at the end of the queue.
    pub fn register(&mut self, cb: impl FnMut(&mut S) -> Keep + Send + 'static) -> CallbackId {
        self.next += 1;
        let id = CallbackId(self.next);
        self.entries.push((id, Box::new(cb)));
        id
    }

    /// Removes a callback; `false` if it was not registered (or removed
    /// itself).
    pub fn unregister(&mut self, id: CallbackId) -> bool {
        let before = self.entries.len();
        self.entries.retain(|(i, _)| *i != id);
        self.entries.len() != before
    }

    /// Whether `id` is on the queue.
    pub fn contains(&self, id: CallbackId) -> bool {
        self.entries.iter().any(|(i, _)| *i == id)
    }

    /// Callbacks registered.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no callback is registered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Runs every callback once; returns the work they reported.
    pub fn run(&mut self, state: &mut S) -> usize {
        let mut work = 0;
        self.entries.retain_mut(|(_, cb)| match cb(state) {
            Keep::Yes(n) => {
                work += n;
                true
            }
            Keep::No(n) => {
                work += n;
                false
            }
        });
        work
    }
}
