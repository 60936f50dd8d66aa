"""The browser client: static HTML, CSS and JavaScript modules, served as they are.

`index.html` is the Serve ingress's model picker, `player.html` the page of one model;
both load their scripts from the `_web/` folder beside them. No Python lives here.
"""
