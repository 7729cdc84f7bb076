// js-ipfs 0.66 (via its libp2p deps) calls Promise.withResolvers, which Node < 22 lacks.
if (typeof Promise.withResolvers !== 'function') {
  Promise.withResolvers = function withResolvers () {
    let resolve
    let reject
    const promise = new Promise((res, rej) => { resolve = res; reject = rej })
    return { promise, resolve, reject }
  }
}
