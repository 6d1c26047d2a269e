package gateway

import "sync"

// bufferPool hands the reverse proxy copy buffers larger than its 32 KiB
// default: bulk transfers (file uploads and downloads) then cost a quarter
// of the read and write system calls.
type bufferPool struct {
	size int
	pool sync.Pool
}

func newBufferPool(size int) *bufferPool {
	p := &bufferPool{size: size}
	p.pool.New = func() any { return make([]byte, p.size) }
	return p
}

func (p *bufferPool) Get() []byte { return p.pool.Get().([]byte) }

func (p *bufferPool) Put(b []byte) {
	if cap(b) >= p.size {
		p.pool.Put(b[:p.size])
	}
}
