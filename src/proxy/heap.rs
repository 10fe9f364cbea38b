//! Futures made on the heap for the request path's large, short-lived phases.
//!
//! Pingora keeps `request_filter`'s future for the whole request, and an async function's
//! state is as large as its largest phase: awaited inline, the upstream connect (Pingora's
//! `get_http_session`, about 9 KiB), the hedge race, the knn embedding call, the shared
//! store's round trip or the pool release would each be held by every open stream until it
//! ends. The send under its deadline goes there too: its timeout is returned by value, and a
//! future held inline in it would be copied out. [`on_heap`] gives such a phase its own allocation, freed when the phase finishes.

/// The future `make` returns, on the heap. The slot is allocated before the future is made,
/// so the compiler builds it in place: nothing is copied in (`Box::pin` of a made future
/// copies all of it, about 9 KiB for the connect, once per request).
pub fn on_heap<F: std::future::Future>(make: impl FnOnce() -> F) -> std::pin::Pin<Box<F>> {
    let slot = Box::<F>::new_uninit();
    Box::into_pin(Box::write(slot, make()))
}
