/*
 * The live page of terrace serve (GET /), tools/serve_page.html, built into the binary as it is:
 * the server reads nothing from disk to serve it, and the page needs nothing but the server (no
 * CDN, no build step).
 */
#include "serve.h"

__asm__(".section .rodata\n"
        ".global serve_page_html\n"
        ".type serve_page_html, %object\n"
        ".balign 16\n"
        "serve_page_html:\n"
        ".incbin \"tools/serve_page.html\"\n"
        ".Lserve_page_end:\n"
        ".byte 0\n"
        ".global serve_page_len\n"
        ".type serve_page_len, %object\n"
        ".balign 4\n"
        "serve_page_len:\n"
        ".long .Lserve_page_end - serve_page_html\n"
        ".previous\n");
