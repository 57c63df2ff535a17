//! The process's heap, as a server holding an image uses it (glibc only; elsewhere these
//! do nothing).
//!
//! A server moving big files allocates a buffer per request for the data it decodes and
//! for each write it queues to the disk, a MiB or so each, and frees it soon after. glibc
//! maps such buffers afresh (`mmap`) or trims the heap under them once freed, so every
//! page of every request is faulted in and zeroed again: on a virtual machine, where a
//! fault costs microseconds, more CPU than the copy itself (perf: 37-90K minor faults per
//! GiB written, in the decoder and the ring's copy).

/// Keeps freed buffers of up to 32 MiB in the heap for the next request, and up to
/// 256 MiB of free heap before trimming it. For a long-lived process that moves file data:
/// call once, before its threads start.
pub fn keep_freed_buffers() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes glibc's allocation thresholds; it has no preconditions
    // and may be called at any time (before other threads allocate, as here, is simplest).
    #[allow(unsafe_code)]
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
}

/// Hands the heap memory freed so far back to the system: after opening an image, whose
/// walk of every internal node held a set of them all (~10 bytes an inode), which glibc
/// would otherwise keep for the life of the server.
pub fn give_back_freed() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only hands free heap pages back to the kernel; it has no
    // preconditions and touches no memory in use.
    #[allow(unsafe_code)]
    unsafe {
        libc::malloc_trim(0);
    }
}
