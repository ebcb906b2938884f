//! The crate's one error type.

use std::panic::Location;

/// Everything that can go wrong in mmobject.
///
/// Every fallible call comes in two forms: `try_*` returns this error, and the
/// plain call panics with this error's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // ---- object manager -------------------------------------------------
    /// The handle or key names an object that has been released or destroyed.
    #[error("stale handle: {type_name}#{index} (generation {generation}) no longer names a live object")]
    StaleHandle {
        /// The object type the handle was for.
        type_name: &'static str,
        /// The key's index.
        index: u32,
        /// The key's generation.
        generation: u32,
    },
    /// The handle belongs to a different `ObjectManager`.
    #[error("handle belongs to object manager #{found}, but was used with object manager #{expected}")]
    WrongManager {
        /// The id of the manager the call was made on.
        expected: u32,
        /// The id of the manager the handle came from (for raw handles: the low 8 bits only).
        found: u32,
    },
    /// A raw handle or key names an object of another type.
    #[error("wrong type: the handle names a {found}, but a {expected} was asked for")]
    WrongType {
        /// The type that was asked for.
        expected: &'static str,
        /// The type the handle actually names.
        found: &'static str,
    },
    /// A raw handle was released more times than it was referenced.
    #[error("double release: {type_name}#{index} has no references left to release")]
    DoubleRelease {
        /// The object type.
        type_name: &'static str,
        /// The key's index.
        index: u32,
    },
    /// The same object was asked for twice in one disjoint borrow
    /// ([`ObjectManager::get_disjoint_mut`](crate::ObjectManager::get_disjoint_mut)).
    #[error("aliased handles: {type_name}#{index} was asked for more than once in one disjoint borrow")]
    AliasedHandles {
        /// The object type.
        type_name: &'static str,
        /// The key's index.
        index: u32,
    },
    /// A type was taken twice from one [`Views`](crate::Views), and at least once for writing.
    #[error(
        "{type_name} is already borrowed {} from these views; a type is taken for writing once, or for \
         reading any number of times, until the views are dropped",
        if *mutably { "for writing" } else { "for reading" }
    )]
    AlreadyBorrowed {
        /// The object type.
        type_name: &'static str,
        /// True if the earlier borrow was for writing.
        mutably: bool,
    },
    /// An [`ObjectKey`](crate::ObjectKey) names no object slot of this manager.
    #[error("unknown key: index {index} names no object slot of this manager")]
    UnknownKey {
        /// The key's index.
        index: u32,
    },
    /// A [`Loader`](crate::Loader) was used after its manager shut down.
    #[error("object manager #{manager} has shut down: its loader cannot create objects any more")]
    ManagerShutDown {
        /// The manager's id.
        manager: u32,
    },
    /// A raw handle is malformed: it names no slot this manager ever handed out.
    #[error("invalid raw handle {raw:#018x}: it names no object slot of this manager")]
    InvalidRawHandle {
        /// The raw handle's bits.
        raw: u64,
    },
    /// Too many references to one object.
    #[error("reference count overflow on {type_name}#{index}")]
    RefCountOverflow {
        /// The object type.
        type_name: &'static str,
        /// The key's index.
        index: u32,
    },
    /// An object store (or the manager) is full.
    #[error("capacity exceeded for {what}: the limit is {limit}")]
    CapacityExceeded {
        /// What is full (a type name, or "object types").
        what: &'static str,
        /// The limit that was hit.
        limit: usize,
    },

    /// An object store's allocator refused memory (a new segment, or room in
    /// a side table). Nothing was lost: `try_create` hands the value back,
    /// and every live object, handle and count is as it was.
    #[error(
        "out of memory: the store allocator `{allocator}` refused {bytes} bytes for {part} of the {type_name} store"
    )]
    StoreOutOfMemory {
        /// The object type whose store needed the memory.
        type_name: &'static str,
        /// What the memory was for: "a new segment", "the raw-reference table", …
        part: &'static str,
        /// The size of the refused request in bytes.
        bytes: usize,
        /// The type name of the allocator that refused.
        allocator: &'static str,
    },

    // ---- allocators ------------------------------------------------------
    /// An allocator has no room for the request.
    #[error("out of memory: requested {requested} bytes, {available} available")]
    OutOfMemory {
        /// Bytes requested (including alignment padding where relevant).
        requested: usize,
        /// Bytes still available in the allocator (or in the relevant class).
        available: usize,
    },
    /// The alignment is not a power of two, or is larger than supported.
    #[error("unsupported alignment {align}: it must be a power of two no larger than {max}")]
    UnsupportedAlignment {
        /// The alignment requested.
        align: usize,
        /// The largest alignment supported.
        max: usize,
    },
    /// A pointer that this allocator never handed out was freed.
    #[error("foreign free: {addr:#x} does not belong to this allocator")]
    ForeignPointer {
        /// The address that was freed.
        addr: usize,
    },
    /// A pointer inside the allocator that does not start a block was freed.
    #[error("bad free: {addr:#x} is not the start of a block (the block starts at {block_start:#x})")]
    NotBlockStart {
        /// The address that was freed.
        addr: usize,
        /// The start of the block that contains it.
        block_start: usize,
    },
    /// A block was freed twice.
    #[error("double free of {addr:#x}")]
    DoubleFree {
        /// The address that was freed twice.
        addr: usize,
    },
    /// A stack marker that is not valid for this stack (from another stack, or above the top).
    #[error("invalid marker: {reason}")]
    InvalidMarker {
        /// Why the marker is invalid.
        reason: &'static str,
    },
    /// A freed block's fill pattern was overwritten: something wrote to it after it was freed.
    #[error("use after free detected: freed block at {addr:#x} was written to")]
    UseAfterFree {
        /// The block's address.
        addr: usize,
    },

    /// A double-buffered frame reference was read after its buffer was reused (two swaps
    /// after it was made), or on an allocator it does not come from.
    #[error(
        "stale frame reference: it was made in frame {frame} of allocator #{owner}, the current frame is {current}"
    )]
    StaleFrameRef {
        /// The frame the reference was made in.
        frame: u64,
        /// The id of the allocator the reference came from.
        owner: u64,
        /// The current frame of the allocator it was used with.
        current: u64,
    },

    // ---- tracker ----------------------------------------------------------
    /// A memory budget would be exceeded.
    #[error("budget exceeded for tag '{tag}': budget {budget} bytes, {current} in use, {requested} requested")]
    BudgetExceeded {
        /// The tag whose budget is exceeded.
        tag: &'static str,
        /// The tag's budget in bytes.
        budget: usize,
        /// Bytes in use under the tag before the request.
        current: usize,
        /// Bytes requested.
        requested: usize,
    },
    /// A pointer the tracker never saw was untracked or freed.
    #[error("untracked free: the tracker has no record of {addr:#x}")]
    UntrackedFree {
        /// The address.
        addr: usize,
    },
    /// Memory the tracker allocated itself was passed to [`Tracker::track`](crate::track::Tracker::track),
    /// which is for memory it did not allocate.
    #[error(
        "already tracked: {addr:#x} is a block the tracker allocated itself; track only memory it did not allocate"
    )]
    AlreadyTracked {
        /// The address.
        addr: usize,
    },
    /// Guard bytes around an allocation were overwritten.
    #[error("buffer overrun: {bytes} guard byte(s) overwritten around the {size}-byte block at {addr:#x} allocated at {site}")]
    BufferOverrun {
        /// The block's address.
        addr: usize,
        /// The block's size.
        size: usize,
        /// How many guard bytes were changed.
        bytes: usize,
        /// Where the block was allocated.
        site: &'static Location<'static>,
    },
}

/// A `Result` whose error is [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
