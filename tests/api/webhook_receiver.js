// A webhook receiver written from docs/events.md alone: it verifies each delivery with the
// standardwebhooks package and prints one JSON line per request (the first line: its port).
// node webhook_receiver.js <whsec_ secret>
const http = require("http");
const { Webhook } = require("standardwebhooks");

const wh = new Webhook(process.argv[2]);
const server = http.createServer((req, res) => {
  let body = "";
  req.setEncoding("utf8");
  req.on("data", (chunk) => (body += chunk));
  req.on("end", () => {
    let line;
    try {
      const event = wh.verify(body, req.headers);
      line = { ok: true, id: event.id, type: event.type, subject: event.subject, sequence: event.sequence,
               data: event.data };
      res.writeHead(204);
    } catch (err) {
      line = { ok: false, error: String(err) };
      res.writeHead(400);
    }
    res.end();
    process.stdout.write(JSON.stringify(line) + "\n");
  });
});
server.listen(0, "127.0.0.1", () => process.stdout.write(JSON.stringify({ port: server.address().port }) + "\n"));
