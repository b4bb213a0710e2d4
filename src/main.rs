//! The redlockd binary. Its body is `redlockd::app::main`, inside the library, so that what
//! it uses stays the crate's own (`pub(crate)`) rather than part of the library's API.

#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    redlockd::app::main()
}
