//! The process's allocator settings for a long-running controller.

/// Caps glibc's malloc arenas at two. By default glibc gives each thread
/// that meets contention its own arena (up to eight per core), and memory
/// freed in one arena is not reused by another: at the bench's `large`
/// scenario that kept about a fifth of the controller's resident memory as
/// free but unreturned pages (peak RSS 377 MiB by default, 300 MiB with
/// two arenas). Call before threads start (arenas already made stay):
/// `main` calls it first thing, for every command. No effect elsewhere
/// than glibc.
pub fn limit_allocator_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        /// `M_ARENA_MAX` of glibc's malloc.h.
        const M_ARENA_MAX: libc::c_int = -8;
        // SAFETY: mallopt only sets a malloc parameter; any value is
        // accepted or refused by glibc (return 0), never undefined.
        let ok = unsafe { libc::mallopt(M_ARENA_MAX, 2) };
        if ok == 0 {
            tracing::debug!("malloc arena limit not set");
        }
    }
}

/// Fixes glibc's mmap threshold at 128 KiB for the controller. By default
/// the threshold rises to the size of the largest freed mmapped block (up
/// to 32 MiB), after which the large transient buffers of lists and watch
/// pages are carved from the heap and leave it fragmented: at the bench's
/// `large` scenario a fixed threshold lowered the controller's peak RSS by
/// about 8 MiB (166-174 to 158-159 MiB; 147-152 to 145 MiB on restart).
/// Not set for `render`, whose large buffers are reused rather than
/// freed. No effect elsewhere than glibc.
pub fn fix_mmap_threshold() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        /// `M_MMAP_THRESHOLD` of glibc's malloc.h.
        const M_MMAP_THRESHOLD: libc::c_int = -3;
        // SAFETY: as in `limit_allocator_arenas`: a malloc parameter.
        let ok = unsafe { libc::mallopt(M_MMAP_THRESHOLD, 128 * 1024) };
        if ok == 0 {
            tracing::debug!("malloc mmap threshold not set");
        }
    }
}
