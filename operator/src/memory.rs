//! Giving freed memory back to the system after a pass. A pass over 100,000 devices allocates and frees hundreds of
//! MiB at once; glibc's allocator keeps what was freed in its heaps for reuse, so the process's RSS stays at the
//! largest pass it ever ran. `malloc_trim` returns the free pages (a walk of the free lists: milliseconds, next to
//! a pass of seconds at that size).

/// Returns the allocator's free pages to the system (glibc only; elsewhere nothing to do).
pub fn give_back() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator's own heaps; it takes no pointers of ours.
    unsafe {
        libc::malloc_trim(0);
    }
}
