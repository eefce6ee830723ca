package convservice

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// claimer decides which replica handles a request when every replica
// receives it (plain subscriptions: Mosquitto 2.0.x never delivers
// $-prefixed topics to shared subscriptions, docs/broker.md). nil means this
// replica handles everything (a single replica, or shared subscriptions).
type claimer interface {
	// claim reports whether this replica won the request identified by the
	// requester's response topic and correlation data.
	claim(ctx context.Context, responseTopic string, correlation []byte) (bool, error)
}

// redisClaimer claims with SET NX: the first replica to write the key wins.
// The key outlives any QoS 1 redelivery window, so a duplicate delivered to
// another replica later is still recognized (the engine would also dedupe it
// by task and correlation; the claim keeps replicas from racing on it).
type redisClaimer struct {
	c       redis.UniversalClient
	prefix  string
	replica string
	ttl     time.Duration
}

func (r *redisClaimer) claim(ctx context.Context, responseTopic string, correlation []byte) (bool, error) {
	h := sha256.New()
	h.Write([]byte(responseTopic))
	h.Write([]byte{0})
	h.Write(correlation)
	key := r.prefix + ":claim:" + hex.EncodeToString(h.Sum(nil)[:16])
	ok, err := r.c.SetNX(ctx, key, r.replica, r.ttl).Result()
	if err != nil {
		return false, fmt.Errorf("claim request in redis: %w", err)
	}
	return ok, nil
}
