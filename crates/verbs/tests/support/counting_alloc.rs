//! A global allocator that counts what this thread allocates (calls and
//! bytes), for tests that bound the engine's allocations: `rx_alloc.rs`
//! (none per FPDU) and `stag_table_memory.rs` (a chosen STag index costs
//! the table little). A test includes it with
//! `#[path = "support/counting_alloc.rs"] mod counting;`; it becomes that
//! test binary's global allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
    static BYTES: Cell<u64> = const { Cell::new(0) };
}

fn count(n: usize) {
    // try_with: the allocator also runs while thread locals are torn down.
    let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
    let _ = BYTES.try_with(|c| c.set(c.get() + n as u64));
}

// SAFETY: every call is passed on unchanged to the system allocator, which
// upholds GlobalAlloc's contract; counting touches only thread-local
// Cells, which allocate nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: the caller's layout, passed on (GlobalAlloc::alloc).
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: as for alloc.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        // SAFETY: `ptr` came from this allocator, i.e. from System, with
        // `layout` (the caller's contract).
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as for realloc.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static A: Counting = Counting;

/// Allocations (including reallocations) this thread has made.
#[allow(dead_code)]
pub fn allocs() -> u64 {
    ALLOCS.with(|c| c.get())
}

/// Bytes this thread has asked for (a reallocation counts its new size).
#[allow(dead_code)]
pub fn bytes() -> u64 {
    BYTES.with(|c| c.get())
}
