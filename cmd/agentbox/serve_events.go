package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/spf13/pflag"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/destpolicy"
	"github.com/agentbox/agentbox/internal/events"
	"github.com/agentbox/agentbox/internal/kube"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store"
)

// eventsFlags are the settings of lifecycle events and webhooks.
type eventsFlags struct {
	MaxAge      time.Duration
	MaxWebhooks int
	QueueMax    int
	Attempts    int
	RetryBase   time.Duration
	RetryMax    time.Duration
	Timeout     time.Duration
}

func addEventsFlags(f *pflag.FlagSet, x *eventsFlags) {
	f.DurationVar(&x.MaxAge, "events-max-age", events.DefaultMaxAge, "how long sandbox lifecycle events are kept and served by GET /events/sandboxes (and how long an undelivered webhook delivery is kept)")
	f.IntVar(&x.MaxWebhooks, "max-webhooks", events.DefaultMaxWebhooks, "most webhooks (POST /events/webhooks) one team may register; more are refused with 429")
	f.IntVar(&x.QueueMax, "webhook-queue-max", events.DefaultQueueMax, "most webhook deliveries one team may be owed at once (a receiver that is down makes them pile up); past it new deliveries are dropped, counted on the webhook (droppedDeliveries, lastError) and logged")
	f.IntVar(&x.Attempts, "webhook-attempts", events.DefaultAttempts, "how many times one webhook delivery is tried (until the receiver answers 2xx) before it is given up")
	f.DurationVar(&x.RetryBase, "webhook-retry-base", events.DefaultRetryBase, "wait after a failed webhook delivery; it doubles with every further failure up to --webhook-retry-max")
	f.DurationVar(&x.RetryMax, "webhook-retry-max", events.DefaultRetryMax, "longest wait between two attempts of a webhook delivery")
	f.DurationVar(&x.Timeout, "webhook-timeout", events.DefaultTimeout, "how long one webhook delivery request may take")
}

// sandboxInfo describes the manager's sandboxes to the events service.
type sandboxInfo struct{ mgr *sandbox.Manager }

func (s sandboxInfo) Info(id string) (events.Info, bool) {
	sb, ok := s.mgr.Lookup(id)
	if !ok {
		return events.Info{}, false
	}
	md := sb.Metadata
	if sb.Metadata[kube.MetaUID] != "" {
		// A sandbox of a Kubernetes object: its events carry the caller's
		// metadata, as the cluster's API shows it, not agentbox's keys.
		md = map[string]string{}
		for k, v := range sb.Metadata {
			if !kube.Bookkeeping(k) {
				md[k] = v
			}
		}
	}
	return events.Info{TemplateID: sb.TemplateID, Metadata: md, StartedAt: sb.StartedAt,
		CPUCount: sb.CPUCount, MemoryMB: sb.MemoryMB}, true
}

// startEvents derives lifecycle events from the manager's audit log,
// delivers them to webhooks through the fetch policy, and serves them.
func startEvents(ctx context.Context, x eventsFlags, st *store.Store, mgr *sandbox.Manager, policy *destpolicy.Policy, apiSrv *api.Server, log *slog.Logger) error {
	svc, err := events.New(ctx, events.Config{MaxAge: x.MaxAge, MaxWebhooks: x.MaxWebhooks, QueueMax: x.QueueMax, Attempts: x.Attempts,
		RetryBase: x.RetryBase, RetryMax: x.RetryMax, Timeout: x.Timeout}, st, mgr.Audit(), sandboxInfo{mgr}, policy, log)
	if err != nil {
		return err
	}
	go svc.Run(ctx)
	apiSrv.SetEvents(svc)
	return nil
}
