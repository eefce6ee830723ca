package convservice

import (
	"hash/fnv"
	"sync"
)

// workers run each message on the worker that owns its correlation data (ordered streams).
type workers struct {
	quit   <-chan struct{}
	shards []chan func()
}

// newWorkers starts n workers. They hold what arrives before started is closed (a persistent
// session's backlog arrives before the replica has its registry), and finish what is queued
// and exit once quit is closed.
func newWorkers(n int, started, quit <-chan struct{}, wg *sync.WaitGroup) *workers {
	w := &workers{quit: quit, shards: make([]chan func(), n)}
	for i := range w.shards {
		ch := make(chan func(), 256)
		w.shards[i] = ch
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-started:
			case <-quit:
				return // never started: nothing to serve them with
			}
			w.work(ch)
		}()
	}
	return w
}

// work runs the jobs of one shard until quit, then what is still queued.
func (w *workers) work(ch chan func()) {
	for {
		select {
		case job := <-ch:
			job()
		case <-w.quit:
			for {
				select {
				case job := <-ch:
					job()
				default:
					return
				}
			}
		}
	}
}

// dispatch runs job on the worker owning key (the correlation data), so
// messages of one reply stream are handled in order. It blocks when that
// worker is saturated, which applies backpressure to the broker.
func (w *workers) dispatch(key []byte, job func()) {
	h := fnv.New32a()
	h.Write(key)
	select {
	case w.shards[h.Sum32()%uint32(len(w.shards))] <- job:
	case <-w.quit:
		// Closing: the broker connection is already gone, nobody would
		// read what this message produced.
	}
}
