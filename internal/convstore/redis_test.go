package convstore

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
)

// TestRedisCommitResent replays a commit whose reply was lost (the client
// resends the script): it must count as done, not as a conflict that makes
// the replica re-decide on its own write.
func TestRedisCommitResent(t *testing.T) {
	addr := startRedis(t)
	s := NewRedis(redis.NewClient(&redis.Options{Addr: addr}), "resend")
	defer s.Close()
	ctx := context.Background()
	key := Key{Agent: "b", ContextID: "C", TaskID: "T1"}
	snap, err := s.load(ctx, key, t0)
	if err != nil {
		t.Fatal(err)
	}
	d := conversation.Decide(conversation.DefaultPolicy(), t0, snap.view, send("T1", "C", "m", "D1"))
	// Capture the exact script call by running commit with a hook that
	// sends every EVALSHA twice.
	s.c.AddHook(resendHook{})
	ok, err := s.commit(ctx, key, snap, d.Context)
	if err != nil || !ok {
		t.Fatalf("resent commit: ok=%v err=%v", ok, err)
	}
	c, err := s.Context(ctx, "b", "C")
	if err != nil || c.Version != 1 {
		t.Fatalf("stored %+v %v", c, err)
	}
}

// resendHook executes every script command twice, returning the second
// reply, like a client retrying after a lost reply.
type resendHook struct{}

func (resendHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (resendHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() != "evalsha" && cmd.Name() != "eval" {
			return next(ctx, cmd)
		}
		if err := next(ctx, cmd); err != nil {
			return err
		}
		return next(ctx, cmd)
	}
}
func (resendHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
