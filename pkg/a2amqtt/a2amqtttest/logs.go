package a2amqtttest

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
)

// Logs is a slog.Handler that keeps every record, for tests that assert what a component
// logged (an expected reconnect is INFO, never WARN or ERROR).
type Logs struct {
	mu      sync.Mutex
	records []slog.Record
}

// Logger returns a logger writing into l.
func (l *Logs) Logger() *slog.Logger { return slog.New(l) }

// Enabled implements slog.Handler: every level is kept.
func (l *Logs) Enabled(context.Context, slog.Level) bool { return true }

// Handle implements slog.Handler.
func (l *Logs) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.records = append(l.records, r.Clone())
	l.mu.Unlock()
	return nil
}

// WithAttrs implements slog.Handler (attributes of derived loggers are not kept).
func (l *Logs) WithAttrs([]slog.Attr) slog.Handler { return l }

// WithGroup implements slog.Handler.
func (l *Logs) WithGroup(string) slog.Handler { return l }

// AtLeast returns the records at level or above as "LEVEL message key=value ...", in order.
func (l *Logs) AtLeast(level slog.Level) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, r := range l.records {
		if r.Level >= level {
			line := r.Level.String() + " " + r.Message
			r.Attrs(func(a slog.Attr) bool { line += " " + a.String(); return true })
			out = append(out, line)
		}
	}
	return out
}

// Has reports whether a record's message contains msg.
func (l *Logs) Has(msg string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.ContainsFunc(l.records, func(r slog.Record) bool { return strings.Contains(r.Message, msg) })
}

// Count returns how many records at level have a message containing msg.
func (l *Logs) Count(level slog.Level, msg string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.records {
		if r.Level == level && strings.Contains(r.Message, msg) {
			n++
		}
	}
	return n
}
