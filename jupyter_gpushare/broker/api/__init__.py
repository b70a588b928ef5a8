"""The broker's HTTP side: REST handlers (``openapi.yaml``), browser pages, the admin page and
the report page, who is calling (tokens, OAuth) and how often they may."""
