//! The engine's hash maps and sets: std's, with foldhash instead of
//! SipHash. Every lookup hashes object names and keys; SipHash was about a
//! tenth of a full render's CPU. foldhash is seeded at random per process
//! as std's hasher is, so names chosen in the cluster cannot aim at
//! collisions of a known function; nothing reads a map's order.

/// [`std::collections::HashMap`] with foldhash.
pub type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// [`std::collections::HashSet`] with foldhash.
pub type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;
