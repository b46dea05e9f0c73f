// /v1/docs: Swagger UI on the hub's own OpenAPI document. A file, not an inline script: the page's
// CSP allows scripts from the hub's origin only (hub/api/docs_ui.py).
window.addEventListener("load", function () {
  window.ui = SwaggerUIBundle({
    url: "/v1/openapi.json",
    dom_id: "#swagger-ui",
    deepLinking: true,
    presets: [SwaggerUIBundle.presets.apis],
    layout: "BaseLayout",
  });
});
