//! The redlockd binary. Its body is `redlockd::app::main`, inside the library, so that what
//! it uses stays the crate's own (`pub(crate)`) rather than part of the library's API.

#[cfg(all(feature = "mimalloc", not(feature = "dhat-heap")))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[cfg(feature = "dhat-heap")]
#[global_allocator]
static GLOBAL: dhat::Alloc = dhat::Alloc;

fn main() -> std::process::ExitCode {
    // Writes dhat-heap.json when dropped, as `main` returns after a graceful stop.
    #[cfg(feature = "dhat-heap")]
    let _profiler = dhat::Profiler::new_heap();
    redlockd::app::main()
}
