package events

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/agentbox/agentbox/internal/destpolicy"
	"github.com/agentbox/agentbox/internal/store"
)

// client is the delivery client: the destination policy's transport, no
// redirects followed (a receiver answers, it does not send us elsewhere).
func (s *Service) client() *http.Client {
	c := s.policy.Client(s.cfg.Timeout)
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return c
}

// deliverLoop sends due deliveries until ctx ends: at most Workers at once
// and PerTeam of one team.
func (s *Service) deliverLoop(ctx context.Context) {
	client := s.client()
	defer client.CloseIdleConnections()
	var (
		mu       sync.Mutex
		inFlight = map[string]bool{} // delivery ids
		perTeam  = map[string]int{}
		wg       sync.WaitGroup
	)
	defer wg.Wait()
	done := make(chan struct{}, 1)
	for {
		due, err := s.st.DueDeliveries(ctx, s.now(), 4*s.cfg.Workers)
		if err != nil && ctx.Err() == nil {
			s.log.Error("read owed deliveries", "err", err)
		}
		busyAll := len(due) > 0
		for _, d := range due {
			mu.Lock()
			busy := inFlight[d.ID] || perTeam[d.TeamID] >= s.cfg.PerTeam || len(inFlight) >= s.cfg.Workers
			if !busy {
				inFlight[d.ID] = true
				perTeam[d.TeamID]++
			}
			mu.Unlock()
			if busy {
				continue
			}
			busyAll = false
			wg.Add(1)
			go func() {
				defer wg.Done()
				s.deliver(ctx, client, d)
				mu.Lock()
				delete(inFlight, d.ID)
				if perTeam[d.TeamID]--; perTeam[d.TeamID] <= 0 {
					delete(perTeam, d.TeamID)
				}
				mu.Unlock()
				select {
				case done <- struct{}{}:
				default:
				}
			}()
		}
		wait := 5 * time.Second
		// Everything due is in flight: the next to finish wakes the loop.
		if next, ok, err := s.st.NextDelivery(ctx); err == nil && ok && !busyAll {
			wait = min(max(next.Sub(s.now()), 10*time.Millisecond), wait)
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-s.wake:
		case <-done:
		case <-timer.C:
		}
		timer.Stop()
	}
}

// maxResponseBytes is how much of a receiver's answer is read (to reuse
// the connection); the rest is dropped.
const maxResponseBytes = 64 << 10

// deliver makes one attempt of d and records its outcome.
func (s *Service) deliver(ctx context.Context, client *http.Client, d store.DeliveryRow) {
	err := s.post(ctx, client, d)
	if ctx.Err() != nil {
		return // the server is stopping: the delivery stays owed
	}
	if err == nil {
		if err := s.st.DeliveryDone(ctx, d.ID); err != nil {
			s.log.Error("record delivery", "delivery", d.ID, "err", err)
		}
		return
	}
	attempts := d.Attempts + 1
	var refused *destpolicy.RefusedError
	switch {
	case errors.As(err, &refused):
		// The policy will refuse every attempt: give up now.
		why := "delivery refused: " + refused.Error()
		s.log.Warn("webhook delivery refused by the destination policy", "team", d.TeamID, "webhook", d.WebhookID, "dest", refused.Dest, "addr", refused.Addr)
		if err := s.st.DeliveryFailed(ctx, d.ID, d.WebhookID, why); err != nil {
			s.log.Error("record delivery", "delivery", d.ID, "err", err)
		}
	case attempts >= s.cfg.Attempts:
		why := fmt.Sprintf("delivery of event %s given up after %d attempts: %v", d.EventID, attempts, err)
		s.log.Warn("webhook delivery given up", "team", d.TeamID, "webhook", d.WebhookID, "event", d.EventID, "attempts", attempts, "err", err)
		if err := s.st.DeliveryFailed(ctx, d.ID, d.WebhookID, why); err != nil {
			s.log.Error("record delivery", "delivery", d.ID, "err", err)
		}
	default:
		next := s.now().Add(s.backoff(attempts))
		if err := s.st.DeliveryRetry(ctx, d.ID, attempts, next, err.Error()); err != nil {
			s.log.Error("record delivery", "delivery", d.ID, "err", err)
		}
	}
}

// backoff is the wait after the n-th failed attempt: RetryBase doubled per
// further failure, at most RetryMax, less up to a tenth at random so
// retries of many deliveries spread out.
func (s *Service) backoff(n int) time.Duration {
	d := s.cfg.RetryBase
	for i := 1; i < n && d < s.cfg.RetryMax; i++ {
		d *= 2
	}
	d = min(d, s.cfg.RetryMax)
	return d - time.Duration(rand.Int64N(int64(d)/10+1))
}

// post sends d's body to its webhook, signed; nil when it answered 2xx.
func (s *Service) post(ctx context.Context, client *http.Client, d store.DeliveryRow) error {
	body := []byte(d.Body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.URL, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("webhook url: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "agentbox-webhooks")
	req.Header.Set(HeaderWebhookID, d.WebhookID)
	req.Header.Set(HeaderDeliveryID, uuid.NewString())
	req.Header.Set(HeaderSignatureVersion, SignatureVersion)
	req.Header.Set(HeaderSignature, Sign(d.Secret, body))
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxResponseBytes))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("the receiver answered %s", resp.Status)
	}
	return nil
}
